"""A throwaway PostgreSQL server for the tests: initdb in a temporary folder, a free port.

    server = ThrowawayPostgres().start()
    url = server.create_database()      # a fresh, empty database each call
    server.stop()

RECEIVER_TEST_PG=postgresql://... uses that server instead (each test still gets a
database of its own, created there). PostgreSQL refuses to run as root, so when the tests
run as root the server runs as the `postgres` system user.

    server = ThrowawayPostgres(durable=True, own=True).start()   # chaos: a server to kill

`durable=True` runs it with fsync and synchronous commit on, as a deployment would: a
commit is in the WAL on disk before the receiver answers 202, so kill() (a crash of the
server) loses nothing committed. The default keeps fsync and synchronous commit off,
which is faster, and a crash of the server can then lose the last commits (still in its
WAL buffers). `own=True` starts a server here even when RECEIVER_TEST_PG names one:
a scenario that kills its server must not kill a shared one.

    bouncer = ThrowawayPgBouncer(server).start()    # PgBouncer, transaction pooling
    url = bouncer.url(server.create_database())      # the same database through it
    bouncer.stop()
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from tests.servers import free_port

STARTUP_TIMEOUT = 30.0


def find_bin(name: str) -> str | None:
    """initdb / pg_ctl on PATH, else under Debian's /usr/lib/postgresql/<version>/bin."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    return candidates[0] if candidates else None


def available(*, own: bool = False) -> str | None:
    """Why no throwaway server can be started here, or None when one can (with own, a
    server of our own even when RECEIVER_TEST_PG names one)."""
    if os.environ.get("RECEIVER_TEST_PG") and not own:
        return None
    missing = [name for name in ("initdb", "pg_ctl") if find_bin(name) is None]
    if missing:
        return f"{' and '.join(missing)} not found (install postgresql, or set RECEIVER_TEST_PG)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser, and PostgreSQL refuses to run as root"
    return None


# A database's shape: its tables and columns, functions, constraints, triggers, schema
# versions, owner and settings; one a test changed is not used again.
_SHAPE = """
SELECT md5(coalesce(string_agg(part, ';' ORDER BY part), '')) FROM (
  SELECT n.nspname || '.' || c.relname || ':' || c.relkind::text || '(' || coalesce(string_agg(
      a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
      || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END, ',' ORDER BY a.attnum), '') || ')'
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
      AND n.nspname NOT LIKE 'pg_toast%' AND n.nspname NOT LIKE 'pg_temp%'
    GROUP BY n.nspname, c.relname, c.relkind
  UNION ALL SELECT 'function ' || n.nspname || '.' || p.proname
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
  UNION ALL SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace = 'public'::regnamespace
  UNION ALL SELECT 'trigger ' || tgname FROM pg_trigger WHERE NOT tgisinternal
  UNION ALL SELECT 'version ' || version FROM schema_version
  UNION ALL SELECT 'owner ' || pg_get_userbyid(datdba)
    FROM pg_database WHERE datname = current_database()
  UNION ALL SELECT 'setting ' || array_to_string(setconfig, ',')
    FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase
    WHERE d.datname = current_database()
) parts(part)
"""
_OTHERS = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
)
_TABLES = (
    "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'schema_version'"
)
_SEQUENCES = "SELECT sequencename FROM pg_sequences WHERE schemaname = 'public'"


def _shape(conn: Any) -> str:
    row = conn.execute(_SHAPE).fetchone()
    return str(row[0])


class ThrowawayPostgres:
    """One PostgreSQL server for the whole test session (or RECEIVER_TEST_PG's)."""

    def __init__(self, *, durable: bool = False, own: bool = False) -> None:
        self.external = None if own else os.environ.get("RECEIVER_TEST_PG")
        self.durable = durable
        self.port = free_port()
        self.dir: Path | None = None
        self._names = itertools.count(1)
        self._template: str | None = None  # a database at the newest schema, once made
        self._shape: str | None = None  # the template's fingerprint (_SHAPE)
        self._migrated: set[str] = set()  # the databases made from the template
        self._free: list[str] = []  # of them, emptied and ready for the next test

    @property
    def admin_url(self) -> str:
        if self.external:
            return self.external
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> ThrowawayPostgres:
        if self.external:
            return self
        self.dir = Path(tempfile.mkdtemp(prefix="receiver-pg-"))
        data = self.dir / "data"
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(
            find_bin("initdb") or "initdb",
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        self._pg_ctl_start()
        return self

    def create_database(self, *, migrated: bool = False) -> str:
        """A new empty database on this server; its URL. Migrated: one at the receiver's
        newest schema and holding nothing, so a server starting on it has no migration to
        run: copied from a template, or one a test before had, emptied (drop_database)."""
        import psycopg

        base = self.admin_url.rsplit("/", 1)[0]
        template = f' TEMPLATE "{self._migrated_template()}"' if migrated else ""
        if migrated and self._free:
            return f"{base}/{self._free.pop()}"
        name = f"receiver_test_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"{template}')
        if migrated:
            self._migrated.add(name)
        return f"{base}/{name}"

    def _migrated_template(self) -> str:
        """The name of this process's database at the newest schema, made on first use by
        the store's own migration runner (migrating is tested on empty databases: pg_url)."""
        if self._template is None:
            import psycopg

            from receiver.store.postgres.schema import migrate

            name = f"receiver_template_{os.getpid()}"
            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
                conn.execute(f'CREATE DATABASE "{name}"')
            with psycopg.connect(f"{self.admin_url.rsplit('/', 1)[0]}/{name}") as conn:
                migrate(conn)
                conn.commit()
                self._shape = _shape(conn)
            self._template = name
        return self._template

    def _emptied(self, name: str) -> bool:
        """Whether a database made from the template was emptied for the next test (its
        rows deleted, its sequences restarted): only if nothing is connected to it and it
        has the template's shape (tables, columns, versions, owner, settings), since a
        test may have changed any of them; else it is dropped. Emptying one costs
        PostgreSQL a small part of what copying the template's 400 files does
        (docs/performance.md, the suite's time)."""
        import psycopg

        try:
            url = f"{self.admin_url.rsplit('/', 1)[0]}/{name}"
            with psycopg.connect(url, autocommit=True) as conn:
                (others,) = conn.execute(_OTHERS).fetchone() or (1,)
                if others or _shape(conn) != self._shape:
                    return False
                tables = [row[0] for row in conn.execute(_TABLES)]
                sequences = [row[0] for row in conn.execute(_SEQUENCES)]
                with conn.transaction():
                    conn.execute("SET LOCAL session_replication_role = replica")  # no FKs
                    for table in tables:
                        conn.execute(f'DELETE FROM "{table}"')
                    for sequence in sequences:
                        conn.execute(f'ALTER SEQUENCE "{sequence}" RESTART')
        except psycopg.Error:
            return False
        return True

    def drop_database(self, url: str) -> None:
        """Drop a database create_database made, ending any session still on it. Each
        holds about 11 MB in 400 files: 120 left to the end took 18 s to delete (the
        last test of each worker waited on it), and a drop takes 15 to 140 ms."""
        import psycopg

        from tests import dbview

        dbview.forget(url)
        name = url.rsplit("/", 1)[1]
        if name in self._migrated and self._emptied(name):
            self._free.append(name)
            return
        self._migrated.discard(name)
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self, mode: str = "fast") -> None:
        if self.external:
            base = self.admin_url.rsplit("/", 1)[0]
            self._migrated.clear()  # dropped below, not kept
            for name in [*self._free, *([self._template] if self._template else [])]:
                self.drop_database(f"{base}/{name}")
            self._free.clear()
            self._template = None
        if self.external or self.dir is None:
            return
        data = self.dir / "data"
        if (data / "postmaster.pid").exists():
            self._run(find_bin("pg_ctl") or "pg_ctl", "-D", str(data), "-m", mode, "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    def kill(self) -> None:
        """Stop the server at once, as a crash would (pg_ctl -m immediate), keeping its data."""
        assert self.dir is not None
        self._run(
            find_bin("pg_ctl") or "pg_ctl", "-D", str(self.dir / "data"), "-m", "immediate", "stop"
        )

    def restart(self) -> None:
        """Start again on the same data and port after kill()."""
        self._pg_ctl_start()

    def _pg_ctl_start(self) -> None:
        assert self.dir is not None
        # fsync off: the tests need PostgreSQL's behaviour, not its durability across a
        # power cut (make bench runs it with fsync on). Durable: a deployment's settings,
        # so a crash of the server (kill()) loses no commit it acknowledged.
        durability = "on" if self.durable else "off"
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
            f" -c fsync={durability} -c synchronous_commit={durability}"
            f" -c full_page_writes={durability} -c max_connections=200"
        )
        self._run(
            find_bin("pg_ctl") or "pg_ctl",
            "-D",
            str(self.dir / "data"),
            "-o",
            options,
            "-l",
            str(self.dir / "server.log"),
            "-w",
            "-t",
            str(int(STARTUP_TIMEOUT)),
            "start",
        )

    def _run(self, *argv: str) -> None:
        command = list(argv)
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        started = time.monotonic()
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=STARTUP_TIMEOUT + 10,
            cwd="/",
            check=False,
        )
        if done.returncode != 0:
            log = ""
            if self.dir is not None and (self.dir / "server.log").exists():
                log = (self.dir / "server.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(
                f"{' '.join(argv[:1])} failed ({done.returncode}) after"
                f" {time.monotonic() - started:.1f}s: {done.stderr.strip()}\n{log}"
            )


def bouncer_available() -> str | None:
    """Why no throwaway PgBouncer can be started here, or None when one can."""
    if find_bouncer() is None:
        return "pgbouncer not found (install pgbouncer)"
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a postgres user, and PgBouncer refuses root"
    return None


def find_bouncer() -> str | None:
    """pgbouncer on PATH, else Debian's /usr/sbin/pgbouncer (not on a user's PATH)."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None


class ThrowawayPgBouncer:
    """PgBouncer in transaction pooling mode in front of a ThrowawayPostgres, on a free port.

    Every database of the server is reachable through it under its own name (a wildcard
    entry), as the server's admin user, without a password (trust). Clients' transactions
    share a few server connections, as behind a production pooler, so a statement prepared
    on one connection is not there on the next. Runs as the `postgres` user when the tests
    run as root (PgBouncer refuses root).
    """

    def __init__(self, server: ThrowawayPostgres, *, pool_size: int = 20) -> None:
        self.server = server
        self.pool_size = pool_size
        self.port = free_port()
        self.dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, database_url: str) -> str:
        """database_url (a database on the server) as reached through this bouncer."""
        parts = urlsplit(database_url)
        user = f"{parts.username}@" if parts.username else ""
        return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{self.port}"))

    def start(self) -> ThrowawayPgBouncer:
        self.dir = Path(tempfile.mkdtemp(prefix="receiver-pgbouncer-"))
        target = urlsplit(self.server.admin_url)
        user = unquote(target.username or "postgres")
        password = unquote(target.password or "")
        server = f"host={target.hostname or '127.0.0.1'} port={target.port or 5432} user={user}"
        if password:
            server += f" password={password}"
        (self.dir / "userlist.txt").write_text(f'"{user}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = {server}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"  # none: nothing left in /tmp
            "auth_type = trust\n"
            f"admin_users = {user}\n"  # admin(): PAUSE, RESUME
            f"auth_file = {self.dir / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 500\n"
            "ignore_startup_parameters = extra_float_digits\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
        )
        as_root = os.geteuid() == 0
        if as_root:
            shutil.chown(self.dir, "postgres", "postgres")
        with (self.dir / "pgbouncer.log").open("ab") as log:  # the child keeps its own copy
            self.proc = subprocess.Popen(
                [find_bouncer() or "pgbouncer", str(self.dir / "pgbouncer.ini")],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd="/",
                user="postgres" if as_root else None,
                group="postgres" if as_root else None,
                extra_groups=[] if as_root else None,
            )
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM (PgBouncer's immediate shutdown), SIGKILL if it lingers; the folder goes."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def admin(self, command: str) -> None:
        """Run a command on the admin console: PAUSE (queries wait, the database seems to
        hang, until RESUME), RESUME, KILL db (connections dropped, refused until RESUME)."""
        import psycopg

        user = unquote(urlsplit(self.server.admin_url).username or "postgres")
        with psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=user,
            dbname="pgbouncer",
            autocommit=True,
            cursor_factory=psycopg.ClientCursor,  # the console speaks the simple protocol
        ) as conn:
            conn.execute(command)

    def logs(self) -> str:
        log = self.dir / "pgbouncer.log" if self.dir else None
        return log.read_text(errors="replace") if log and log.exists() else ""

    def _wait_until_ready(self) -> None:
        """Until a query through the bouncer reaches the server (not merely a listening port)."""
        import psycopg

        assert self.proc is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"pgbouncer exited {self.proc.returncode} at start:\n{self.logs()[-2000:]}"
                )
            try:
                with psycopg.connect(
                    self.url(self.server.admin_url), autocommit=True, connect_timeout=2
                ) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"pgbouncer did not accept connections in {STARTUP_TIMEOUT:g}s: {exc}"
                        f"\n{self.logs()[-2000:]}"
                    ) from exc
                time.sleep(0.05)
