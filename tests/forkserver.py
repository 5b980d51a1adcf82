"""Test servers forked from a process that has imported the receiver already.

`python -m receiver serve` spends most of its start importing the receiver (about 0.4 s of
CPU), and the suite starts some 300 servers on a 2-core machine. A fork server (one for
each test process, started on first use) imports what `serve` imports, then forks a child
for each start. The child is the real server in a process of its own: it sets the test's
environment, working folder and log, and runs `receiver serve` through the CLI's own entry
(receiver/__main__.py), under uvicorn, as the command line does. The harness's cli() runs
its other commands the same way. Signals reach it by its
pid; its exit status comes back as Popen's would (negative for a signal), since the fork
server reaps it and says so. Only the imports are shared, done before any fork: the fork
server itself runs nothing of the receiver, holds no thread, and opens no store.

tests/harness.py starts servers this way; RECEIVER_TEST_FORK=0 makes it run each as
`python -m receiver serve` again (tests/cli/test_serve.py runs the command line itself).
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

# What `receiver serve` imports before it serves (python -X importtime -m receiver serve).
PRELOAD = (
    "receiver.cli",
    "receiver.cli._server",
    "receiver.cli.serve",
    "receiver.app",
    "receiver.edge.http",
    "uvicorn",
    "uvicorn.main",
    "uvicorn.server",
    "uvicorn.lifespan.on",
    "uvicorn.loops.auto",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.websockets.auto",
    "uvicorn.loops.uvloop",
    "receiver.upstream.client",
    "receiver.upstream.enrich",
    "anyio.streams.memory",
    "anyio.streams.stapled",
    "encodings.idna",
    "runpy",
)


def _child(request: dict[str, Any], closing: list[int]) -> None:
    """In the forked child: become `receiver ARGS` with the request's environment, and
    never return."""
    code = 1
    try:
        for fd in closing:
            os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        for fd, path in ((1, request["log"]), (2, request.get("err") or request["log"])):
            opened = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["receiver", *request["args"]]
        import runpy

        try:
            runpy.run_module("receiver", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def main() -> None:
    """Read one JSON request a line on stdin ({id, args, env, cwd, log, err}: stderr to
    err, or with stdout to log without one); answer each
    with {"id": I, "pid": N}, and each child's end with {"id": I, "code": C}: by the
    request's id, since a pid is used again once its process is reaped. Ends at stdin's
    end."""
    for name in PRELOAD:
        importlib.import_module(name)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a child's end wakes the select
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    closing = [wake_r, wake_w, selector.fileno()]
    children: dict[int, int] = {}  # pid -> the id of its request
    pending = b""
    while True:
        answers = []
        for key, _ in selector.select():
            if key.fd == wake_r:
                os.read(wake_r, 512)
                continue
            read = os.read(0, 65536)
            if not read:
                return
            pending += read
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(request, closing)
                children[pid] = request["id"]
                answers.append({"id": request["id"], "pid": pid})
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                answers.append({"id": children.pop(pid), "code": code})
        if answers:
            os.write(1, "".join(json.dumps(a) + "\n" for a in answers).encode())


class Forked:
    """A server the fork server started, as the harness uses a subprocess.Popen."""

    def __init__(self, server: ForkServer, id: int, pid: int, args: list[str]) -> None:
        self.server = server
        self.id = id
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exits.get(self.id)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self.server.changed:
            ended = self.server.changed.wait_for(lambda: self.poll() is not None, timeout)
        if not ended:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The test process's fork server: started on first use, stopped by stop()."""

    def __init__(self) -> None:
        root = Path(__file__).resolve().parent.parent
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.forkserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=root,
            text=True,
        )
        self.exits: dict[int, int] = {}  # a start's id -> its exit status
        self.changed = threading.Condition()
        self._pids: dict[int, int] = {}  # a start's id -> its pid
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # one start at a time: its answer is the next pid
        self._reader = threading.Thread(target=self._read, name="forkserver", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = json.loads(line)
            with self.changed:
                if "pid" in message:
                    self._pids[message["id"]] = message["pid"]
                else:
                    self.exits[message["id"]] = message["code"]
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def start(
        self, args: list[str], env: dict[str, str], log: Path, err: Path | None = None
    ) -> Forked:
        """`receiver ARGS` forked with env, its stdout appended to log, its stderr to err
        (to log without one)."""
        assert self.proc.stdin is not None
        id = next(self._ids)
        request = {
            "id": id,
            "args": args,
            "env": env,
            "cwd": os.getcwd(),
            "log": str(log),
            "err": str(err) if err else None,
        }
        with self._lock:  # one writer of the pipe at a time
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        with self.changed:
            if not self.changed.wait_for(lambda: id in self._pids, 30):
                raise AssertionError(f"the fork server did not fork (exit {self.proc.poll()})")
            pid = self._pids.pop(id)
        return Forked(self, id, pid, ["receiver", *args])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Stop it (its stdin closed ends it); a server it forked that still runs is the
        test's to stop, as a Popen's would be."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(5)
        if self.proc.stdout is not None and not self._reader.is_alive():
            self.proc.stdout.close()


if __name__ == "__main__":
    main()
