"""Log lines a sender cannot forge or flood: escaping in the text format, and LogLimiter."""

import asyncio
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from receiver.logs import JSONFormatter, LogLimiter, TextFormatter, escape
from receiver.redact import redact_url

FORGED = "evt_1\n2026-01-01 00:00:00,000 INFO    receiver: all clear"


def record(msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("receiver.ingest", logging.WARNING, __file__, 1, msg, args, exc_info)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        pytest.param("a\nb", "a\\nb", id="newline"),
        pytest.param("a\r\nb", "a\\r\\nb", id="crlf"),
        pytest.param("\x1b[2J\x1b[31mred", "\\x1b[2J\\x1b[31mred", id="terminal-escape"),
        pytest.param("a\tb\x00c\x7f", "a\\tb\\x00c\\x7f", id="tab-nul-del"),
        pytest.param("a\x85b\u2028c\u2029d", "a\\x85b\\u2028c\\u2029d", id="unicode-line-breaks"),
        pytest.param("evil\u202etxt.exe", "evil\\u202etxt.exe", id="bidi-override"),
        pytest.param("évt_ü ok \\n", "évt_ü ok \\n", id="printable-unchanged"),
    ],
)
def test_escape_writes_control_characters_as_escapes(value: str, shown: str) -> None:
    assert escape(value) == shown


def test_an_event_id_with_a_newline_cannot_forge_a_text_line() -> None:
    formatter = TextFormatter("%(levelname)s %(name)s: %(message)s")
    line = formatter.format(record("rejected invalid_event (event %s): bad", FORGED))
    assert "\n" not in line and "\r" not in line
    assert line == (
        "WARNING receiver.ingest: rejected invalid_event (event evt_1\\n2026-01-01"
        " 00:00:00,000 INFO    receiver: all clear): bad"
    )


def test_a_traceback_keeps_its_lines_but_the_message_is_escaped() -> None:
    text = TextFormatter("%(message)s").format(record("failed on %s", "a\nb", exc=True))
    first, *rest = text.splitlines()
    assert first == "failed on a\\nb"
    assert rest[0] == "Traceback (most recent call last):" and rest[-1] == "ValueError: boom"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        pytest.param(
            "store postgresql://receiver:s3cret@db:5432/receiver",
            "store postgresql://receiver:***@db:5432/receiver",
            id="url",
        ),
        pytest.param(
            "postgres://u:p%40ss:w0rd@db/x and https://bot:tok@chat.example/hook",
            "postgres://u:***@db/x and https://bot:***@chat.example/hook",
            id="two-urls",
        ),
        pytest.param(
            "connect postgresql://db/x?user=u&password=s3cret&sslmode=require",
            "connect postgresql://db/x?user=u&password=***&sslmode=require",
            id="query",
        ),
        pytest.param("host=db user=u Password=s3cret", "host=db user=u Password=***", id="libpq"),
        pytest.param("./data/receiver.db", "./data/receiver.db", id="a-path"),
        pytest.param("mail to ops@example.com", "mail to ops@example.com", id="an-address"),
        pytest.param("postgresql://receiver@db/receiver", "postgresql://receiver@db/receiver"),
    ],
)
def test_redact_url_replaces_passwords_only(text: str, shown: str) -> None:
    assert redact_url(text) == shown


def test_no_formatter_writes_a_url_password_whoever_logs_it() -> None:
    url = "postgresql://receiver:s3cret@db/receiver"
    try:
        raise ConnectionError(f"cannot reach {url}")
    except ConnectionError:
        exc_info = sys.exc_info()
    rec = logging.LogRecord("psycopg", logging.ERROR, __file__, 1, "db %s", (url,), exc_info)
    rec.dsn = url  # an extra field, as a JSON line carries it
    for formatter in (TextFormatter("%(message)s"), JSONFormatter()):
        line = formatter.format(rec)
        assert "s3cret" not in line and "receiver:***@db" in line, line
        rec.exc_text = None  # each formatter writes the traceback afresh


def test_json_lines_stay_one_line_and_keep_the_value() -> None:
    rec = record("rejected (event %s)", FORGED)
    rec.event_id = FORGED
    line = JSONFormatter().format(rec)
    assert "\n" not in line
    assert json.loads(line)["event_id"] == FORGED


# -- LogLimiter ------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def lines() -> Iterator[list[logging.LogRecord]]:
    """What the limiter lets through to the logger "test.limited"."""
    logger, handler = logging.getLogger("test.limited"), ListHandler()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler.records
    logger.removeHandler(handler)


def test_first_lines_per_reason_and_client_then_one_summary(
    lines: list[logging.LogRecord],
) -> None:
    clock = Clock()
    limiter = LogLimiter(logging.getLogger("test.limited"), burst=5, window=60, clock=clock)
    written = [
        limiter.warning("invalid_signature rejections", "10.0.0.7", "rejected %d", i)
        for i in range(20_000)
    ]
    # Another reason, and another client, each have a burst of their own.
    assert limiter.warning("missing_signature rejections", "10.0.0.7", "rejected other")
    assert limiter.warning("invalid_signature rejections", "10.0.0.8", "rejected third")
    assert written.count(True) == 5 and written[:5] == [True] * 5
    assert [r.getMessage() for r in lines] == [
        *(f"rejected {i}" for i in range(5)),
        "rejected other",
        "rejected third",
    ]
    clock.now += 61  # the window ends: the next line (any key) writes the summary first
    assert limiter.warning("invalid_signature rejections", "10.0.0.7", "rejected again")
    assert [r.getMessage() for r in lines[7:]] == [
        "suppressed 19,995 more invalid_signature rejections from 10.0.0.7 in the last 60s",
        "rejected again",
    ]
    assert lines[7].levelno == logging.WARNING and lines[7].suppressed == 19_995  # type: ignore[attr-defined]


def test_summary_keeps_the_code_but_not_an_event_id(lines: list[logging.LogRecord]) -> None:
    clock = Clock()
    limiter = LogLimiter(logging.getLogger("test.limited"), burst=1, window=10, clock=clock)
    for i in range(3):
        limiter.warning("a", "c", "line", extra={"code": "event_too_old", "event_id": f"e{i}"})
    clock.now += 10
    limiter.flush()
    summary = lines[-1]
    assert summary.getMessage() == "suppressed 2 more a from c in the last 10s"
    assert summary.code == "event_too_old"  # type: ignore[attr-defined]
    assert not hasattr(summary, "event_id")


def test_a_window_with_nothing_suppressed_ends_silently(lines: list[logging.LogRecord]) -> None:
    clock = Clock()
    limiter = LogLimiter(logging.getLogger("test.limited"), burst=5, window=60, clock=clock)
    limiter.warning("a", "c", "one")
    clock.now += 120
    limiter.flush()
    assert [r.getMessage() for r in lines] == ["one"]


def test_memory_is_bounded_by_max_keys(lines: list[logging.LogRecord]) -> None:
    clock = Clock()
    limiter = LogLimiter(
        logging.getLogger("test.limited"), burst=2, window=60, max_keys=10, clock=clock
    )
    for i in range(10_000):  # a different client address each time
        limiter.warning("invalid_signature rejections", f"10.0.{i // 256}.{i % 256}", "line")
    assert len(limiter._keys) <= 10
    # 10 clients with a key each (one line each), then everyone else shares one key (the
    # oldest client's key makes room for it) and its burst of 2.
    assert len(lines) == 10 + 2
    clock.now += 60
    limiter.flush()
    assert lines[-1].getMessage() == (
        "suppressed 9,988 more invalid_signature rejections from other sources in the last 60s"
    )
    assert not limiter._keys


def test_the_summary_comes_on_time_under_an_event_loop(lines: list[logging.LogRecord]) -> None:
    async def main() -> None:
        limiter = LogLimiter(logging.getLogger("test.limited"), burst=1, window=0.05)
        for _ in range(4):
            limiter.warning("conflicting duplicates", "127.0.0.1", "conflict")
        await asyncio.sleep(0.2)  # no further line: the timer writes the summary

    asyncio.run(main())
    assert [r.getMessage() for r in lines] == [
        "conflict",
        "suppressed 3 more conflicting duplicates from 127.0.0.1 in the last 0.05s",
    ]
