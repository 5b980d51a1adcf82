"""Bulk actions the admin page runs in the background, each with a page of its progress."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Job:
    """A bulk action running in the background, with its progress."""

    id: int
    title: str
    total: int
    done: int = 0
    finished: bool = False
    error: str | None = None
    started: float = field(default_factory=time.time)


class Jobs:
    """The jobs started since the receiver started, by id, and the tasks running them."""

    def __init__(self) -> None:
        self._jobs: dict[int, Job] = {}
        self._ids = itertools.count(1)
        # The running tasks are held here: the event loop keeps only a weak reference.
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, title: str, total: int, run: Callable[[Job], Coroutine[Any, Any, None]]) -> Job:
        """A new job, with run(job) started as a task of its own."""
        job = Job(next(self._ids), title, total)
        self._jobs[job.id] = job
        task = asyncio.create_task(run(job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    def get(self, job_id: int) -> Job | None:
        return self._jobs.get(job_id)
