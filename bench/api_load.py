"""The read API bench's load: wrk flat out or paced, and single timed GETs."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.client import HTTPConnection
from itertools import islice
from pathlib import Path
from typing import Any

from bench.api_store import (
    BENCH,
    LOAD_CPU,
    SECRET,
    uptime,
)
from receiver import signature
from receiver.simulator.walk import event_stream, timestamp

# -- load -----------------------------------------------------------------------------------


@dataclass
class Run:
    """One wrk run: requests a second and latency, in ms."""

    rps: float
    p50: float
    p99: float
    requests: int
    errors: str  # "-" for none
    load: str
    max: float = 0.0


def wrk_argv(
    port: int,
    script: str,
    script_args: Sequence[str],
    *,
    seconds: float,
    connections: int,
    pin: bool,
) -> list[str]:
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "5s", "--latency"]
    argv += ["-s", str(BENCH / script), f"http://127.0.0.1:{port}", "--", *script_args]
    return ["taskset", "-c", LOAD_CPU, *argv] if pin else argv


def wrk_result(stdout: str, stderr: str, returncode: int, load: str) -> Run:
    match = re.search(r"^BENCH (\{.*\})$", stdout, re.MULTILINE)
    if returncode != 0 or match is None:
        raise SystemExit(f"wrk failed ({returncode}):\n{stdout}\n{stderr}")
    got = json.loads(match.group(1))
    kinds = ("connect", "read", "write", "status", "timeout")
    errors = ", ".join(f"{k} {got[k]}" for k in kinds if got[k]) or "-"
    return Run(
        got["requests"] / (got["duration_us"] / 1e6),
        got["p50_us"] / 1000,
        got["p99_us"] / 1000,
        got["requests"],
        errors,
        load,
        got["max_us"] / 1000,
    )


def wrk(
    port: int,
    script: str,
    script_args: Sequence[str],
    *,
    seconds: float,
    connections: int,
    pin: bool,
) -> Run:
    load = uptime()
    argv = wrk_argv(port, script, script_args, seconds=seconds, connections=connections, pin=pin)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120)
    return wrk_result(done.stdout, done.stderr, done.returncode, load)


def reads(port: int, paths: Path, key: str, *, seconds: float, connections: int, pin: bool) -> Run:
    return wrk(
        port, "reads.lua", [str(paths), key], seconds=seconds, connections=connections, pin=pin
    )


def get(port: int, path: str, key: str) -> tuple[int, bytes, float]:
    """One GET on a new connection: status, body and seconds to the last byte."""
    conn = HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        started = time.perf_counter()
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"})
        response = conn.getresponse()
        body = response.read()
        return response.status, body, time.perf_counter() - started
    finally:
        conn.close()


def get_json(port: int, path: str, key: str) -> Any:
    status, body, _ = get(port, path, key)
    if status != 200:
        raise SystemExit(f"GET {path}: {status} {body[:300]!r}")
    return json.loads(body)


def write_paths(path: Path, paths: Sequence[str]) -> Path:
    path.write_text("".join(f"{p}\n" for p in paths))
    return path


def write_stream(path: Path, *, count: int, seed: int, run: str) -> None:
    """count signed deliveries for bench/events.lua, "<signature>\\t<body>" a line, from the
    random walk bench/run.py sends, dated to end a minute ago (as run.py's stream)."""
    written = list(islice(event_stream(seed=seed, sessions=200, threshold=40, run=run), count))
    shift = (
        datetime.fromisoformat(written[-1]["timestamp"]) - datetime.now(UTC) + timedelta(minutes=1)
    )
    with path.open("w") as out:
        for event in written:
            event["timestamp"] = timestamp(datetime.fromisoformat(event["timestamp"]) - shift)
            body = json.dumps(event, separators=(",", ":"))
            out.write(f"{signature.sign(SECRET.encode(), body.encode())}\t{body}\n")
