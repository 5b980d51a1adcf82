"""`receiver serve --workers N`: the listening socket bound once, N worker processes serving
it, each the whole receiver on the one store; the parent restarts a worker that dies and
stops them all on SIGTERM or SIGINT.

The workers are started afresh (multiprocessing's spawn, as uvicorn's own supervisor does:
nothing of the parent's threads or event loop is copied into them) and each opens the
store itself. They share what the store holds (events, outbox claims, alert state, timers:
see docs/operations.md, "Several worker processes"); the rest is per process, as with
replicas: /metrics, logs, the lanes of sends in flight, the rules file's reloads.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from multiprocessing.connection import wait
from types import FrameType
from typing import Any

from receiver.edge.http import WATCHDOG_SLACK, Server
from receiver.settings import Settings

log = logging.getLogger("receiver.workers")

# A worker that exits before it has started serving, this many times in a row (with no
# worker starting in between), stops the whole server: the store or the app is broken,
# and starting it again would fail the same way for ever.
START_ATTEMPTS = 3
# A worker that died within this many seconds of its start waits this long before its
# replacement starts, so a worker that keeps crashing does not spin the parent.
QUICK_DEATH = 10.0
RESTART_PAUSE = 1.0
# How often a worker looks whether its parent is still there (a parent killed with
# SIGKILL cannot stop them): an orphaned worker stops as on SIGTERM.
ORPHAN_CHECK = 1.0
# Past a worker's own grace and its watchdog's slack (receiver.edge.http), the parent waits
# this much more for it to exit before it kills it.
STOP_SLACK = 1.0


class _Worker:
    """One worker process, its slot, and whether it has started serving."""

    def __init__(self, slot: int, process: Any, started: Any) -> None:
        self.slot = slot
        self.process = process
        self.started = started  # a multiprocessing Event, set once it serves
        self.serving = False  # whether the parent has seen it set
        self.since = time.monotonic()


class Workers:
    """The parent: starts the workers, restarts one that dies, stops them all on a signal."""

    def __init__(
        self, flags: dict[str, Any], settings: Settings, sockets: list[socket.socket]
    ) -> None:
        self.flags = flags
        self.settings = settings
        self.sockets = sockets
        self.count = settings.workers
        self.context = multiprocessing.get_context("spawn")
        self.workers: list[_Worker] = []
        self.failed_starts = 0  # in a row, with no worker starting in between
        self.stopping_since: float | None = None
        self.gave_up = False
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self._signals: list[int] = []

    def run(self) -> int:
        """Serve until a signal (or until the workers keep failing to start); the exit
        status: 0 when every worker stopped cleanly, else 1."""
        found = {
            sig: signal.signal(sig, self._on_signal)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        }
        try:
            log.info(
                "starting %d worker processes on http://%s:%d (parent pid %d)",
                self.count,
                self.settings.host,
                self.settings.port,
                os.getpid(),
            )
            self.workers = [self._start(slot) for slot in range(self.count)]
            while self.stopping_since is None:
                self._watch()
            return self._stop()
        finally:
            for sig, handler in found.items():
                signal.signal(sig, handler)
            os.close(self._wake_read)
            os.close(self._wake_write)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self._signals.append(sig)
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_write, b"x")

    def _start(self, slot: int) -> _Worker:
        started = self.context.Event()
        process = self.context.Process(
            target=serve_worker,
            args=(self.flags, self.sockets, started, os.getpid(), slot),
            name=f"receiver-worker-{slot}",
            daemon=False,
        )
        process.start()
        log.info("worker %d started (pid %s)", slot, process.pid)
        return _Worker(slot, process, started)

    def _watch(self) -> None:
        """Wait for a signal or a worker's exit, and deal with it."""
        sentinels = {w.process.sentinel: w for w in self.workers}
        ready = wait([self._wake_read, *sentinels], timeout=1.0)
        if self._wake_read in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_read, 64)
        for sig in self._signals[:]:
            self._signals.remove(sig)
            if sig == signal.SIGHUP:  # each worker reloads its own rules
                log.info("SIGHUP: each worker reloads the rules")
                self._forward(signal.SIGHUP)
            elif self.stopping_since is None:
                log.info("%s: stopping the workers", signal.Signals(sig).name)
                self.stopping_since = time.monotonic()
        for worker in self.workers:
            if not worker.serving and worker.started.is_set():
                worker.serving = True  # a start that worked: the failures in a row end
                self.failed_starts = 0
        for sentinel in ready:
            if sentinel in sentinels and self.stopping_since is None:
                self._replace(sentinels[sentinel])

    def _replace(self, dead: _Worker) -> None:
        """A worker exited while the server runs: start another in its slot, or give up
        when workers keep failing to start."""
        process = dead.process
        process.join()
        how = _exit_text(process.exitcode)
        ran = time.monotonic() - dead.since
        if not dead.started.is_set():
            self.failed_starts += 1
            log.error(
                "worker %d (pid %s) %s before it started serving (%d of %d starts failed in a row)",
                dead.slot,
                process.pid,
                how,
                self.failed_starts,
                START_ATTEMPTS,
            )
            if self.failed_starts >= START_ATTEMPTS:
                log.critical("workers keep failing to start; stopping (see the errors above)")
                self.gave_up = True
                self.stopping_since = time.monotonic()
                self.workers.remove(dead)
                return
        else:
            log.error("worker %d (pid %s) %s after %.1fs; starting another", dead.slot,
                      process.pid, how, ran)  # fmt: skip
        if ran < QUICK_DEATH:
            time.sleep(RESTART_PAUSE)
        self.workers[self.workers.index(dead)] = self._start(dead.slot)

    def _forward(self, sig: int) -> None:
        for worker in self.workers:
            if worker.process.exitcode is None and worker.process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.process.pid, sig)

    def _stop(self) -> int:
        """SIGTERM to every worker; wait for them within the grace (and the slack each
        worker's watchdog allows itself); kill what is left. The exit status."""
        assert self.stopping_since is not None
        self._forward(signal.SIGTERM)
        deadline = self.stopping_since + self.settings.shutdown_grace + WATCHDOG_SLACK + STOP_SLACK
        for worker in self.workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.exitcode is None:
                log.critical("worker %d (pid %s) did not stop in time; killing it",
                             worker.slot, worker.process.pid)  # fmt: skip
                worker.process.kill()
                worker.process.join()
        took = time.monotonic() - self.stopping_since
        # A worker still starting dies of the SIGTERM itself (its handlers are not in place
        # yet): it had taken nothing, so that is a clean stop too.
        clean = all(w.process.exitcode in (0, -signal.SIGTERM) for w in self.workers)
        log.info("all workers stopped in %.1fs", took)
        return 1 if self.gave_up or not clean else 0


def _exit_text(code: int | None) -> str:
    """How a process ended, in words: 'exited 3', 'was killed by SIGKILL'."""
    if code is None:
        return "is still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited {code}"


def serve_worker(
    flags: dict[str, Any], sockets: list[socket.socket], started: Any, parent: int, slot: int
) -> None:
    """A worker process serving the parent's sockets: the first (slot 0) the whole
    receiver, the others ingest and the API only (receiver.app.create_app's routing), so
    one process routes, runs the timers and sends while all of them take events in.
    Settings come from the same flags and the environment the parent had (spawn passes
    it on), so the secrets never travel on a command line."""
    from receiver import logs
    from receiver.app import STARTUP_FAILURE, create_app
    from receiver.cli._server import server_config
    from receiver.errors import ConfigError

    # SIGHUP (the parent forwards it: reload the rules) must not end a worker still
    # starting; the app's lifespan puts its own handler in place of this.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    settings = Settings(**flags)
    logs.configure(settings.log_format, settings.log_level)
    try:
        app = create_app(settings, routing=slot == 0)
    except ConfigError as exc:
        log.error("worker cannot start: %s", exc)
        raise SystemExit(STARTUP_FAILURE) from exc

    def stopping(since: float) -> None:
        app.state.shutdown_started = since

    server = _WorkerServer(
        server_config(app, settings), grace=settings.shutdown_grace, on_stopping=stopping
    )
    server.started_event = started
    threading.Thread(target=_orphan_watch, args=(server, parent), daemon=True).start()
    server.run(sockets)


def _orphan_watch(server: Any, parent: int) -> None:
    """Stop the worker, as on SIGTERM, once its parent is gone."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_CHECK)
    log.error("the parent process (pid %d) is gone; stopping", parent)
    server.handle_exit(signal.SIGTERM, None)


class _WorkerServer(Server):
    """receiver.edge.http.Server telling the parent once it serves (its lifespan started)."""

    started_event: Any = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.started_event is not None:
            self.started_event.set()
