"""Storage faults over real HTTP: a full disk and a read-only filesystem.

A full disk is a real size-capped tmpfs (tests run as root here; skipped where
mounting is not allowed). The locked database is in tests/test_ingest.py.

A filesystem cannot be made read-only under a running receiver: Linux refuses
to remount read-only while a process holds files open for writing (EBUSY), and
SQLite keeps its database and WAL open read-write; `chattr +i` does not affect
descriptors already open either. What can happen, and is tested, is a receiver
started on a read-only filesystem: it refuses to start, saying why.
"""

import json
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from receiver import events
from tests.harness import Receiver, signed

pytestmark = pytest.mark.e2e


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs mounted at tmp_path/disk."""
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def body(event_id: str, pad: int = 20_000) -> bytes:
    return json.dumps(events.sample("score.drop", id=event_id, padding="x" * pad)).encode()


def stored(db: Path, ids: list[str]) -> set[str]:
    with sqlite3.connect(db) as conn:
        marks = ",".join("?" * len(ids))
        return {r[0] for r in conn.execute(f"SELECT id FROM events WHERE id IN ({marks})", ids)}


def test_full_disk_answers_503_keeps_no_partial_rows_and_recovers(
    tmp_path: Path, small_disk: Path
) -> None:
    server = Receiver(
        tmp_path, env={"RECEIVER_DB": str(small_disk / "receiver.db"), "RECEIVER_MAX_BODY": "65536"}
    )
    server.db = small_disk / "receiver.db"
    server.start()
    assert server.proc is not None
    pid = server.proc.pid
    try:
        first = body("evt_disk_0")
        assert server.post(first, signed(first)).status_code == 202
        # Fill what is left of the disk.
        filler = small_disk / "filler"
        # Unbuffered: a buffered file would raise ENOSPC again when the block closes it.
        with filler.open("wb", buffering=0) as out:
            try:
                while True:
                    out.write(b"\0" * 65536)
            except OSError:
                pass
        refused: list[str] = []
        for i in range(1, 200):  # the WAL may have room for a few before it must grow
            b = body(f"evt_disk_{i}")
            response = server.post(b, signed(b))
            if response.status_code == 503:
                assert response.json()["error"]["code"] == "storage_unavailable"
                refused.append(f"evt_disk_{i}")
                if len(refused) >= 5:
                    break
            else:
                assert response.status_code == 202
        assert len(refused) >= 5, "the full disk never refused an event"
        # Not ready while the store cannot take an event (an empty write transaction would
        # still commit on a full disk: the probe writes for real).
        ready = server.get("/readyz")
        assert ready.status_code == 503 and ready.json()["error"]["code"] == "not_ready"
        # The probe's own one-row write may still fit in the WAL: the free space says it.
        assert "store is not writable: " in ready.json()["error"]["message"]
        assert "disk is full" in ready.json()["checks"]["store"]
        assert server.get("/readyz").status_code == 503  # the probe does not pass by itself
        filler.unlink()
        # Ready again by itself, before any event is sent: the probe's own write succeeds,
        # and the loops the full disk paused (routing, retention) each succeed on their
        # next turn, a second or a few later.
        deadline = time.monotonic() + 60
        while (ready := server.get("/readyz")).status_code != 200:
            assert time.monotonic() < deadline, f"not ready again: {ready.text}"
            time.sleep(0.1)
        assert stored(server.db, refused) == set()  # nothing half-written
        for event_id in refused:  # the sender's retries land, no restart needed
            b = body(event_id)
            assert server.post(b, signed(b)).status_code == 202
        assert stored(server.db, refused) == set(refused)
        assert server.get("/readyz").status_code == 200
        assert server.proc is not None and server.proc.pid == pid
        assert "storage unavailable" in server.logs()
    finally:
        server.stop()


def test_read_only_filesystem_at_start_is_refused_with_a_reason(
    tmp_path: Path, small_disk: Path
) -> None:
    env = {"RECEIVER_DB": str(small_disk / "receiver.db")}
    server = Receiver(tmp_path, env=env).start()
    server.stop()
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    try:
        with pytest.raises(AssertionError, match="cannot open database"):
            Receiver(tmp_path, env=env).start()
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=False)
