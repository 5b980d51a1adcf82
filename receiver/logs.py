"""Logging set-up: readable text lines or JSON lines (RECEIVER_LOG_FORMAT), one record a line
whatever the values in it, and LogLimiter for lines that a sender can make us write at will."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from receiver import tracing
from receiver.redact import redact_url

# Attributes every LogRecord has; anything else was passed in `extra=` and goes into JSON lines.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JSONFormatter(logging.Formatter):
    """JSON lines; any password in a URL is replaced by *** (redact_url), whoever logged it.
    With tracing on, a line logged within a span carries its trace_id and span_id."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact_url(record.getMessage()),
        }
        if tracing.on and (ids := tracing.log_ids()) is not None:
            # The line joins its event's trace (receiver.tracing): the span it was logged in.
            line["trace_id"], line["span_id"] = ids
        for key, value in vars(record).items():
            if key not in _STANDARD and value is not None:
                line[key] = redact_url(value) if isinstance(value, str) else value
        if record.exc_info:
            line["exc"] = redact_url(self.formatException(record.exc_info))
        return json.dumps(line, default=str)


# Characters that would end a text line or act on a terminal: C0 and C1 controls (newline,
# carriage return, escape, NEL...), DEL, the Unicode line and paragraph separators, and the
# bidirectional overrides that make text display in another order than it reads.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape(text: str) -> str:
    r"""text with each unsafe character written as its Python escape, so it stays on one line.

    >>> escape("evt_1\n2026-01-01 00:00:00 INFO forged")
    'evt_1\\n2026-01-01 00:00:00 INFO forged'
    >>> escape("\x1b[31mred\u2028")
    '\\x1b[31mred\\u2028'
    """
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(lambda m: _ESCAPES.get(m[0]) or repr(m[0])[1:-1], text)


class TextFormatter(logging.Formatter):
    """The text format, with control characters in the message escaped: a value that came
    with a request (an event id with a newline in it) cannot start a line of its own.
    A traceback, which is ours, keeps its lines. Any password in a URL is replaced by ***
    (redact_url), whoever logged it: a library's error can quote a connection string."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return escape(redact_url(super().formatMessage(record)))

    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging's name
        return redact_url(super().formatException(ei))


class LogLimiter:
    """At most `burst` lines a `window` (seconds) for each (what, source), then one summary.

    For lines a sender can make us write at will (rejected requests): 20,000 unsigned
    POSTs must not write 20,000 lines. Past the burst, lines are counted instead; when
    the window ends (or, without a running event loop, at the next line) one line says
    how many were left out:

        limiter = LogLimiter(log)
        limiter.warning("invalid_signature rejections", "10.0.0.7", "rejected %s", "...")
        # later: "suppressed 19,995 more invalid_signature rejections from 10.0.0.7
        #         in the last 60s"

    Memory is bounded: past max_keys sources, new ones share one key per `what`
    ("other sources"). Counters elsewhere count every event; this only trims the log.
    Use it from one thread (the event loop).
    """

    OTHERS = "other sources"

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = 5,
        window: float = 60.0,
        max_keys: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.burst = burst
        self.window = window
        self.max_keys = max_keys
        self.clock = clock
        # (what, source) -> [window start, lines written, lines suppressed, level, extra],
        # oldest window first (a key whose window ends is removed, so it comes back last).
        self._keys: OrderedDict[tuple[str, str], list[Any]] = OrderedDict()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def warning(
        self,
        what: str,
        source: str,
        msg: str,
        *args: object,
        extra: Mapping[str, Any] | None = None,
    ) -> bool:
        """log() at WARNING."""
        return self.log(logging.WARNING, what, source, msg, *args, extra=extra)

    def log(
        self,
        level: int,
        what: str,
        source: str,
        msg: str,
        *args: object,
        extra: Mapping[str, Any] | None = None,
        exc_info: BaseException | None = None,
    ) -> bool:
        """Log msg % args unless this (what, source) used up its burst; True if written."""
        now = self.clock()
        self.flush(now)
        key = (what, source)
        state = self._keys.get(key)
        if state is None:
            if len(self._keys) >= self.max_keys:
                key = (what, self.OTHERS)
                state = self._keys.get(key)
            if state is None:
                if len(self._keys) >= self.max_keys:
                    self._summarize(*self._keys.popitem(last=False))
                state = self._keys[key] = [now, 0, 0, level, extra]
        if state[1] < self.burst:
            state[1] += 1
            self.logger.log(level, msg, *args, extra=extra, exc_info=exc_info)
            return True
        state[2] += 1
        if self._timer is None or self._timer_loop is None or self._timer_loop.is_closed():
            self._arm(state[0] + self.window - now)
        return False

    def flush(self, now: float | None = None) -> None:
        """Write the summary of every window that has ended, and forget those windows."""
        now = self.clock() if now is None else now
        while self._keys:
            key, state = next(iter(self._keys.items()))
            if state[0] + self.window > now:
                break
            del self._keys[key]
            self._summarize(key, state)

    def _summarize(self, key: tuple[str, str], state: list[Any]) -> None:
        suppressed, level, extra = state[2], state[3], state[4]
        if suppressed:
            fields = {k: v for k, v in (extra or {}).items() if k != "event_id"}
            self.logger.log(
                level,
                "suppressed %s more %s from %s in the last %ss",
                f"{suppressed:,}",
                key[0],
                key[1],
                f"{self.window:g}",
                extra={**fields, "suppressed": suppressed},
            )

    def _arm(self, delay: float) -> None:
        """Summarize on time when there is an event loop to wake us; else at the next line."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer = loop.call_later(max(delay, 0.0) + 0.01, self._tick)
        self._timer_loop = loop

    def _tick(self) -> None:
        self._timer = None
        now = self.clock()
        self.flush(now)
        pending = [state[0] for state in self._keys.values() if state[2]]
        if pending:
            self._arm(min(pending) + self.window - now)


# Libraries whose loggers are held at WARNING or above even at --log-level debug.
THIRD_PARTY = (
    "uvicorn",
    "apprise",
    "httpx",
    "httpcore",
    "urllib3",
    "requests",
    "watchfiles",
    "asyncio",
    "multipart",
    "markdown",
    "mail.log",
)


def configure(fmt: str = "text", level: str = "info") -> None:
    """Send our logs and uvicorn's to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # Our loggers ("receiver.*") at the chosen level; every other library's at WARNING or
    # above whatever it is: their debug lines can carry URLs, and their info lines are
    # noise. The root's level is what a library's logger without its own level inherits;
    # the ones below are set too, in case the library set a level of its own.
    chosen = logging.getLevelName(level.upper())
    root.setLevel(max(logging.WARNING, chosen))
    logging.getLogger("receiver").setLevel(chosen)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    for name in THIRD_PARTY:
        logging.getLogger(name).setLevel(max(logging.WARNING, chosen))
