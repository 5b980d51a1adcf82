"""`receiver backtest` on more than one core: a replay run in a process forked beside this one.

A backtest replays two rules files over the same events. Each file's notifications depend
only on the events and on what each event did to its alert (the same for both files), never
on the other file, so each file can be replayed in a process of its own, reading the events
itself: the report is the same as one process replaying both (tests/test_backtest_parallel.py
holds the two to it). The processes share nothing but the database file, which both only
read.

    beside = Forked(lambda: replay(current))   # forked now, before this process opens a store
    mine = replay(candidate)
    theirs = beside.result()                   # what the child returned, or what it raised

The child is forked, not spawned: it inherits the loaded rules files and the imported code
(no second start, nothing pickled on the way in); its result comes back pickled through a
pipe. Fork before this process starts threads (the store's, a progress bar's): only the
forking thread lives on in the child.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar

from receiver.errors import ReceiverError

T = TypeVar("T")
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when its parent ends


class ReplayProcessError(ReceiverError):
    """The process replaying beside this one died or failed without an error of ours."""


def can_fork() -> bool:
    """Whether this process may fork a replay: only its own thread runs. A fork copies the
    other threads' locks, held or not, and none of those threads lives on in the child to
    let go (a test running the CLI beside a server in threads would hang now and then)."""
    return threading.active_count() == 1


def cores() -> int:
    """How many cores this process may run on (taskset and cgroups' cpusets count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Forked(Generic[T]):
    """fn() run in a child process forked now; result() waits for what it returned."""

    def __init__(self, fn: Callable[[], T]) -> None:
        context = multiprocessing.get_context("fork")
        self._receive, send = context.Pipe(duplex=False)
        self._process = context.Process(target=_child, args=(fn, send, os.getpid()), daemon=True)
        self._process.start()
        send.close()  # the child's end: EOF here once the child is gone

    def result(self) -> T:
        """What fn returned in the child; what it raised is raised here."""
        try:
            outcome, value = self._receive.recv()
        except EOFError:
            self._process.join()
            raise ReplayProcessError(
                f"the replay process beside this one died (exit code {self._process.exitcode})"
            ) from None
        finally:
            self._receive.close()
        self._process.join()
        if outcome == "raised":
            raise value
        if outcome == "failed":
            raise ReplayProcessError(f"the replay process beside this one failed:\n{value}")
        return value  # type: ignore[no-any-return]

    def cancel(self) -> None:
        """Stop the child (this process failed or was interrupted: its result is not read)."""
        if self._process.is_alive():
            self._process.terminate()
        self._process.join()
        self._receive.close()


def _child(fn: Callable[[], Any], send: Connection, parent: int) -> None:
    _end_with(parent)
    try:
        outcome: tuple[str, Any] = ("returned", fn())
    except Exception as exc:  # raised in the parent as its own (a missing database, ...)
        outcome = ("raised", exc)
    except BaseException:  # interrupted: the parent was too, and cancels
        outcome = ("failed", traceback.format_exc())
    try:
        send.send(outcome)
    except Exception:  # an error that does not pickle arrives as its traceback's text
        send.send(("failed", traceback.format_exc()))
    send.close()


def _end_with(parent: int) -> None:
    """Be terminated when the parent ends, however it ends (Linux): a parent killed with
    SIGTERM or SIGKILL runs no exit handler, and its child would replay on for minutes."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the child ends when it sends its result
        return
    if os.getppid() != parent:  # the parent ended before the line above
        os._exit(1)
