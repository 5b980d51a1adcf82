"""The real receiver as a child process: `python -m receiver serve` under uvicorn on a free port."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from http.cookiejar import CookieJar, DefaultCookiePolicy
from pathlib import Path
from typing import Any, Protocol

import httpx

from receiver import signature
from tests import dbview
from tests.forkserver import ForkServer
from tests.servers import HOST, free_port

SECRET = "test-secret-0123456789"
# The pytest test running now (tests/conftest.py sets it before its fixtures): a real
# server may start only for a test marked e2e, so `make test-fast` (-m "not e2e") never
# waits on one. None outside pytest (the benchmarks use the harness too).
current_test: Any = None


def _must_be_e2e(what: str) -> None:
    if current_test is not None and current_test.get_closest_marker("e2e") is None:
        raise AssertionError(
            f"{current_test.nodeid} starts {what} but is not marked e2e"
            " (pytestmark = pytest.mark.e2e, or @pytest.mark.e2e on the test)"
        )


# The harness's requests go through one client. httpx.get() and httpx.post() build a client
# for each call, and with it an SSL context loading the CA bundle: 50 ms of CPU a call even
# for http://, twenty times a second while a start polls /healthz, taken from the server
# importing beside it on a busy 2-core machine. This client keeps what such a call does not:
# no connection is kept alive (each request opens its own, as before), and no cookie is kept
# (its jar's policy accepts none). Its connection pool is thread-safe.
http_client = httpx.Client(
    limits=httpx.Limits(max_keepalive_connections=0),
    cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[])),
)


# How long a start may take before the test fails: /healthz answering is the condition
# (a start that holds returns at once). Generous, since a busy machine takes seconds to
# import the receiver, and a test that restarts one under load often more than 9.
STARTUP_TIMEOUT = 60.0
SHUTDOWN_GRACE = 5.0  # RECEIVER_SHUTDOWN_GRACE for test servers
# How long stop() waits for an exit before it kills: the grace, plus the watchdog's slack
# and room for a busy machine. A server still there then is a bug, and the test fails.
STOP_TIMEOUT = SHUTDOWN_GRACE + 10.0


class Process(Protocol):
    """A server's process, as the harness uses it: a subprocess.Popen, or a child of the
    fork server (tests/forkserver.py)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...


# Servers are forked from a process that has imported the receiver (tests/forkserver.py),
# unless RECEIVER_TEST_FORK=0: then each is `python -m receiver serve` of its own.
FORK = os.environ.get("RECEIVER_TEST_FORK", "1") != "0"
_forks: ForkServer | None = None


def _fork_server() -> ForkServer:
    """This test process's fork server, started on first use (again if it died)."""
    global _forks
    if _forks is None or not _forks.alive():
        _forks = ForkServer()
    return _forks


def _spawn(args: list[str], env: dict[str, str], log: Path) -> Process:
    """`receiver ARGS` with env, its output appended to log."""
    if FORK:
        return _fork_server().start(args, env, log)
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "receiver", *args], env=env, stdout=out, stderr=out
        )


def run_cli(
    args: list[str], env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`receiver ARGS` with env in a process of its own, its output captured, as
    subprocess.run(..., capture_output=True, text=True) would: forked from the fork server
    (no second of CPU importing the receiver again), unless RECEIVER_TEST_FORK=0."""
    if not FORK:
        command = [sys.executable, "-m", "receiver", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="receiver-cli-") as folder:
        out, err = Path(folder) / "out", Path(folder) / "err"
        proc = _fork_server().start(args, env, out, err)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            raise
        read = (path.read_text() if path.exists() else "" for path in (out, err))
        return subprocess.CompletedProcess(["receiver", *args], code, *read)


def stop_fork_server() -> None:
    """Stop this test process's fork server, if it started one (the session's end)."""
    global _forks
    if _forks is not None:
        _forks.stop()
        _forks = None


# Every receiver process started and not yet stopped; tests/conftest.py stops those a test
# leaves behind, and fails the run if any process the tests started outlives the session.
_running: set[Process] = set()


def running() -> set[Process]:
    """The receiver processes started and not yet stopped."""
    return set(_running)


def stop_process(proc: Process, timeout: float = STOP_TIMEOUT) -> int:
    """SIGTERM, then SIGKILL if proc is still there after timeout; its exit status."""
    _running.discard(proc)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(10)


_template: Path | None = None  # this process's SQLite file at the newest schema, once made


def _migrated_sqlite() -> Path:
    """A SQLite file at the receiver's newest schema, holding nothing, made on first use by
    the store's own migration runner: a server's first start copies it rather than spend
    its CPU migrating (migrating itself is tested on empty files: tests/store)."""
    global _template
    if _template is None:
        from receiver.store.sqlite.schema import migrate

        folder = Path(tempfile.mkdtemp(prefix="receiver-template-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        conn = sqlite3.connect(folder / "receiver.db", isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            migrate(conn)
        finally:
            conn.close()
        _template = folder / "receiver.db"
    return _template


class Receiver:
    """Start, stop, kill and restart the receiver on one database file and port."""

    def __init__(
        self,
        tmp: Path,
        *,
        rules: str | None = None,
        env: dict[str, str] | None = None,
        secret: str = SECRET,
        db: str | None = None,
    ) -> None:
        self.tmp = tmp
        self.db = tmp / "receiver.db"  # the SQLite file, unless db names another store
        self.db_url = db or str(self.db)
        self.rules = tmp / "rules.yaml"
        if rules is not None or not self.rules.exists():
            self.rules.write_text(rules or "rules:\n  - name: all\n    notify: [console]\n")
        self.log = tmp / "receiver.log"
        self.port = free_port()
        self.secret = secret
        self.env = {
            **os.environ,
            "RECEIVER_PORT": str(self.port),
            "RECEIVER_DB": self.db_url,
            "RECEIVER_RULES": str(self.rules),
            "RECEIVER_SECRETS": secret,
            "RECEIVER_LOG_LEVEL": "debug",
            "RECEIVER_RETRY_INITIAL": "0.3",
            # Leases (2 x the longer send timeout + 10 s) run out 16 s after a claim.
            "RECEIVER_NOTIFY_TIMEOUT": "3",
            "RECEIVER_WEBHOOK_TIMEOUT": "3",
            "RECEIVER_SHUTDOWN_GRACE": str(SHUTDOWN_GRACE),
            **(env or {}),
        }
        self.proc: Process | None = None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> Receiver:
        """Started once /healthz answers 200 from this process: not from another server
        (another test worker's) that got the same port from free_port() in the seconds
        before this one bound it, while this one exits 1, "address already in use"."""
        _must_be_e2e("a real server")
        if self.db_url == str(self.db) and not self.db.exists():
            shutil.copyfile(_migrated_sqlite(), self.db)
        with _hold(self.port):
            self.proc = _spawn(["serve"], self.env, self.log)
            _running.add(self.proc)
            deadline = time.monotonic() + STARTUP_TIMEOUT
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    _running.discard(self.proc)
                    code, self.proc = self.proc.returncode, None
                    raise AssertionError(f"receiver exited {code}:\n{self.logs()}")
                try:
                    answered = http_client.get(f"{self.url}/healthz", timeout=1).status_code == 200
                except httpx.HTTPError:
                    answered = False
                if answered and _listens(self.proc.pid, self.port):
                    return self
                time.sleep(0.05)
        self.stop(signal.SIGKILL)
        raise AssertionError(f"receiver did not start in {STARTUP_TIMEOUT}s:\n{self.logs()}")

    def tail(self, lines: int = 40) -> str:
        """Whether the process runs (or how it exited) and the last lines of its log: for
        a failure message."""
        state = "not started" if self.proc is None else f"pid {self.proc.pid}"
        if self.proc is not None and self.proc.poll() is not None:
            state += f", exited {self.proc.returncode}"
        log = "\n".join(self.logs().splitlines()[-lines:])
        return f"receiver {self.url} ({state}), last {lines} lines of {self.log}:\n{log}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int:
        """Send sig and return the exit status. A server that has not exited within
        timeout is killed (SIGKILL), and the test fails: it never outlives its test."""
        proc, self.proc = self.proc, None
        assert proc is not None, "receiver is not running"
        try:
            if proc.poll() is None:
                proc.send_signal(sig)
            try:
                return proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
                name = signal.Signals(sig).name
                tail = "\n".join(self.logs().splitlines()[-30:])
                raise AssertionError(
                    f"receiver did not exit within {timeout:g}s of {name}; killed it:\n{tail}"
                ) from None
        finally:
            _running.discard(proc)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def logs(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows from the server's database (SQLite or PostgreSQL); `?` placeholders."""
        return dbview.query(self.db_url, sql, params)

    def post(
        self, body: bytes, headers: dict[str, str] | None = None, client: httpx.Client | None = None
    ) -> httpx.Response:
        return (client or http_client).post(
            f"{self.url}/v1/events", content=body, headers=headers or {}, timeout=15
        )

    def send(self, event: dict[str, Any], client: httpx.Client | None = None) -> httpx.Response:
        body = json.dumps(event).encode()
        return self.post(
            body, {signature.SIGNATURE_HEADER: signature.sign(self.secret.encode(), body)}, client
        )

    def get(self, path: str, key: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return http_client.get(f"{self.url}{path}", headers=headers, timeout=10)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`receiver ARGS --db <this database>`, as an operator runs it beside the server."""
        return run_cli([*args, "--db", self.db_url], self.env)

    def make_key(self, name: str, plan: str = "enterprise", role: str = "reader") -> str:
        """A new API key made with `receiver keys create --json`, run in this process by
        Click's runner (as tests/cli/test_cli.py runs it) with the server's environment:
        the same command on the same database, without a process of its own that spends
        a second of CPU importing the receiver beside the server. In a thread of its own:
        the command runs asyncio.run(), which refuses a thread with a loop running (the
        browser tests' Playwright runs one in theirs)."""
        import threading

        from click.testing import CliRunner, Result

        from receiver.cli import cli

        args = ["keys", "create", "--name", name, "--plan", plan, "--role", role, "--json"]
        results: list[Result] = []
        runner = threading.Thread(
            target=lambda: results.append(
                CliRunner().invoke(cli, [*args, "--db", self.db_url], env=self.env)
            )
        )
        runner.start()
        runner.join(60)
        assert results, "receiver keys create did not finish in 60 s"
        [done] = results
        assert done.exit_code == 0, (done.output, done.exception)
        return str(json.loads(done.stdout)["key"])

    def metric(self, name: str, labels: str = "") -> float:
        """A sample's value from /metrics, 0 if absent."""
        wanted = f"{name}{{{labels}}}" if labels else name
        for line in self.get("/metrics").text.splitlines():
            if line.startswith(wanted + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


@contextlib.contextmanager
def _hold(port: int) -> Iterator[None]:
    """Keep port from free_port() in other processes (a bind to port 0 skips a bound port)
    until the server binds it too, which SO_REUSEADDR allows beside a socket not listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            held.bind((HOST, port))
        except OSError as exc:
            raise AssertionError(f"port {port} is taken: a process is bound there") from exc
        yield


def _listens(pid: int, port: int) -> bool:
    """Whether process pid holds the socket listening on port (Linux's /proc; elsewhere,
    True: the check is skipped)."""
    tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]
    if not tables[0].exists():
        return True
    suffix = f":{port:04X}"
    listening = {
        fields[9]
        for table in tables
        if table.exists()
        for fields in (line.split() for line in table.read_text().splitlines()[1:])
        if fields[1].endswith(suffix) and fields[3] == "0A"  # 0A: LISTEN
    }
    try:
        fds = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
    except OSError:  # exited meanwhile (an fd closed while read, too: asked again)
        return False
    return any(fd.removeprefix("socket:[").removesuffix("]") in listening for fd in fds)


def signed(body: bytes, secret: str = SECRET) -> dict[str, str]:
    return {signature.SIGNATURE_HEADER: signature.sign(secret.encode(), body)}


class FakeClock:
    """Time for the app under test: moves only when the test says so, then wakes the timers."""

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start
        self.apps: list[Any] = []
        # Called before each move: a send in flight must be recorded first, or the jump
        # would expire its lease and it would be sent again (a test race, not a bug).
        self.settle: list[Callable[[], None]] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        for settle in self.settle:
            settle()
        self.now += seconds
        for app in self.apps:
            app.state.wake()


class InProcessReceiver:
    """The real app under uvicorn on a free port, in a thread of the test, on a FakeClock."""

    def __init__(self, tmp: Path, rules: str, clock: FakeClock, **settings: Any) -> None:
        self.settings = settings  # more of receiver.settings.Settings' fields
        self.db = tmp / "receiver.db"
        self.rules = tmp / "rules.yaml"
        self.rules.write_text(rules)
        self.clock = clock
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: Any = None
        self.thread: Any = None

    def start(self) -> InProcessReceiver:
        _must_be_e2e("the app under uvicorn")
        import threading

        import uvicorn

        from receiver.app import create_app
        from receiver.settings import Settings

        settings = Settings(
            db=str(self.db),
            rules=self.rules,
            secrets=SECRET,
            port=self.port,
            retry_initial=0.2,
            notify_timeout=3,
            # Tests here place events in time freely and move the clock by hand: an event
            # minutes ahead of the fake clock is the scenario, not a wrong sender clock.
            max_clock_skew=0,
            **self.settings,
        )
        app = create_app(settings, clock=self.clock)
        self.clock.apps = [app]
        self.clock.settle = [self.wait_sent]
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_config=None, access_log=False, lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not self.server.started:
            assert time.monotonic() < deadline, "in-process receiver did not start"
            assert self.thread.is_alive(), "in-process receiver failed to start"
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(20)
        assert not self.thread.is_alive(), "in-process receiver did not stop"

    def send(self, event: dict[str, Any]) -> httpx.Response:
        body = json.dumps(event).encode()
        return http_client.post(
            f"{self.url}/v1/events",
            content=body,
            timeout=10,
            headers={signature.SIGNATURE_HEADER: signature.sign(SECRET.encode(), body)},
        )

    def wait_sent(self, timeout: float = 10) -> None:
        """Wait until no notification is being sent or due (every claim's outcome recorded).
        A due row may be in a claim that read the clock before the move and commits after
        it, with a lease the move has already expired."""
        sql = (
            "SELECT 1 FROM outbox WHERE state = 'sending'"
            " OR (state IN ('pending', 'held') AND next_at <= ?) LIMIT 1"
        )
        deadline = time.monotonic() + timeout
        while dbview.query(str(self.db), sql, (self.clock.now,)):
            assert time.monotonic() < deadline, "a send in flight did not finish"
            time.sleep(0.02)

    def wait_routed(self, count: int, timeout: float = 10) -> None:
        """Wait until count events are routed, so that moving the clock cannot race routing."""
        import sqlite3

        deadline = time.monotonic() + timeout
        while True:
            with sqlite3.connect(self.db) as conn:
                done = conn.execute(
                    "SELECT count(*) FROM events WHERE routed_at IS NOT NULL"
                ).fetchone()[0]
            if done >= count:
                return
            assert time.monotonic() < deadline, f"{done} of {count} events routed"
            time.sleep(0.02)

    def outbox(self) -> list[tuple[str, str, str, str]]:
        """(event id, rule, kind, state) of every outbox row, oldest first."""
        import sqlite3

        with sqlite3.connect(self.db) as conn:
            return conn.execute(
                "SELECT event_id, rule, kind, state FROM outbox ORDER BY id"
            ).fetchall()


def eventually(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """check()'s first truthy answer, polled until a deadline generous enough for a busy
    2-core machine. Each wait ends soon after it holds: the first looks come 20 ms apart,
    then further apart, up to 200 ms, so a long wait leaves the CPU to the server it
    waits on (a look is a query or a scrape, for the server too)."""
    deadline = time.monotonic() + timeout
    pause = 0.02
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 1.25, 0.2)
