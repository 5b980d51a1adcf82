"""`receiver serve` and the docs agree: every setting is a flag, every command written in the
README, the docs/ pages (and the shipped rules.yaml) parses, and a start that fails says why in
one line."""

import importlib.util
import logging
import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from receiver import logs, rules
from receiver.cli import cli
from receiver.cli.serve import serve
from receiver.settings import Settings, env_prepare_threshold
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
PAGES = {p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))}
# Variables that are not `receiver serve` settings: its secrets (never a flag: the signing
# secrets and the upstream API key), what `receiver send` / `sign` read, and the keys of
# `receiver simulate --serve-api` (the fake upstream).
NOT_SERVE = {
    "RECEIVER_SECRETS",
    "RECEIVER_UPSTREAM_KEY",
    "RECEIVER_SLACK_BOT_TOKEN",
    "RECEIVER_SLACK_SIGNING_SECRET",
    "RECEIVER_URL",
    "RECEIVER_SIGN_SECRET",
    "RECEIVER_SIMULATE_KEYS",
}


def _flag(variable: str) -> str:
    return "--" + variable.removeprefix("RECEIVER_").lower().replace("_", "-")


def test_every_setting_is_a_serve_flag() -> None:
    flags = {opt for param in serve.params for opt in param.opts}
    fields = {f"RECEIVER_{name.upper()}" for name in Settings.model_fields}
    missing = sorted(_flag(v) for v in fields - NOT_SERVE if _flag(v) not in flags)
    assert missing == []


def _configuration_table() -> str:
    """docs/configuration.md's table of settings, as `make docs` writes it (docs/hooks.py)."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    assert "<!-- generated: settings -->" in PAGES["configuration.md"]
    table: str = hooks.configuration_markdown()
    return table


def test_serve_help_names_every_part_the_app_serves() -> None:
    """Each path the app answers (every part on), by its family (/v1/NAME, or its first
    segment), is named in `receiver serve --help`: not only /v1/events and the probes."""
    from receiver.app import create_app

    app = create_app(Settings(db=":memory:", public_url="http://receiver"))
    # A mount's routes (the admin page's) are its own path's family.
    paths = [getattr(route, "path", "") for route in app.routes]
    families = {
        "/".join(p.split("{")[0].split("/")[: 3 if p.startswith("/v1/") else 2]).rstrip("/")
        for p in paths
    }
    help_text = CliRunner().invoke(cli, ["serve", "--help"], terminal_width=200).output
    assert {"/v1/alerts", "/admin", "/act", "/metrics"} <= families
    assert sorted(f for f in families if f not in help_text) == []


def test_every_setting_in_the_docs_table_is_a_serve_flag() -> None:
    listed = set(re.findall(r"^\| `(RECEIVER_[A-Z_]+)` \|", _configuration_table(), flags=re.M))
    assert {"RECEIVER_NOTIFY_TIMEOUT", "RECEIVER_RETRY_FOR"} <= listed
    assert {f"RECEIVER_{name.upper()}" for name in Settings.model_fields} | NOT_SERVE == listed
    flags = {opt for param in serve.params for opt in param.opts}
    assert sorted(_flag(v) for v in listed - NOT_SERVE if _flag(v) not in flags) == []
    help_text = CliRunner().invoke(cli, ["serve", "--help"], terminal_width=200).output
    for variable in listed - NOT_SERVE:
        assert variable in help_text, variable


def _commands(text: str, *, comments: bool = False) -> list[str]:
    """Every `receiver ...` command line in text's code blocks (or `# ...` comments)."""
    found = []
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.DOTALL) if not comments else [text]
    for block in blocks:
        block = block.replace("\\\n", " ")
        for line in block.splitlines():
            if comments:  # "# Check a change before deploying it:   receiver check"
                _, sep, command = line.partition("  receiver ")
                line = f"receiver {command}" if sep else ""
            line = line.strip().removeprefix("$ ")
            match = re.match(r"^(?:[A-Z_]+=\S+ )*(?:\.venv/bin/)?receiver( .*)?$", line)
            if match and not re.match(r"^receiver[:.]", line):
                found.append(line)
    return found


def _parse(line: str) -> None:
    """Parse a command line as `receiver` would, without running it (UsageError if wrong)."""
    words = shlex.split(line, comments=True)
    while "=" in words[0]:
        words.pop(0)
    command: click.Command = cli
    ctx = click.Context(cli, info_name="receiver")
    args = words[1:]
    while isinstance(command, click.Group) and args and not args[0].startswith("-"):
        name, args = args[0], args[1:]
        found = command.get_command(ctx, name)
        assert found is not None, f"no command {name!r}: {line}"
        command = found
        ctx = click.Context(command, info_name=name, parent=ctx)
    with command.make_context(ctx.info_name, args, parent=ctx.parent):
        pass  # parsed; leaving closes what the options opened (--file)


def test_readme_and_rules_yaml_commands_work_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    # Files the commands read (click opens them while parsing): the README's own
    # `send --save evt_1.json` would write this one before its `send --file evt_1.json`.
    for name in ("event.json", "evt_1.json"):
        (tmp_path / name).write_text("{}")
    written = [line for text in (README, *PAGES.values()) for line in _commands(text)]
    written += _commands(rules.starter_text().split("\nnotifiers:", 1)[0], comments=True)
    assert "receiver explain --file event.json" in written  # the rules.yaml comment
    assert "receiver backtest rules.new.yaml --since 24h --json" in written  # docs/backtest.md
    assert len(written) > 30
    for line in written:
        try:
            _parse(line)
        except click.UsageError as exc:
            pytest.fail(f"{line}: {exc.format_message()}")


def test_readme_says_how_receiver_gets_on_the_path_before_using_it_bare() -> None:
    first_bare = re.search(r"^(\$ )?receiver ", README, flags=re.MULTILINE)
    assert first_bare is not None
    assert ". .venv/bin/activate" in README[: first_bare.start()]


# -- a start that fails: one line, no traceback, nothing said as if it were running ----------


def _serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
    run = subprocess.run(
        [sys.executable, "-m", "receiver", "serve", *args],
        cwd=tmp_path,
        env={**environ, "RECEIVER_SECRETS": "s3cret", **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return run.returncode, run.stdout + run.stderr


@pytest.mark.e2e
def test_a_corrupt_database_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "receiver.db").write_bytes(os.urandom(8192))
    code, out = _serve(tmp_path, "--db", "receiver.db", "--port", str(free_port()))
    assert code == 1
    assert out == "Error: cannot open database receiver.db: file is not a database\n"


@pytest.mark.e2e
def test_a_busy_port_is_one_clear_line_and_nothing_says_receiving(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, out = _serve(tmp_path, "--port", str(port))
    assert code == 1
    assert out == (
        f"Error: cannot listen on 127.0.0.1:{port}: address already in use"
        " (is another server running there? choose another with --port)\n"
    )


@pytest.mark.e2e
def test_invalid_settings_are_said_in_our_words(tmp_path: Path) -> None:
    code, out = _serve(tmp_path, "--port", "99999", "--retry-max", "soon")
    assert code == 1
    assert "RECEIVER_PORT (--port): must be less than or equal to 65535" in out
    assert 'RECEIVER_RETRY_MAX (--retry-max): invalid duration "soon"' in out
    assert "value error" not in out.lower() and "input should" not in out.lower()


@pytest.mark.parametrize(
    ("given", "expected"), [("5", 5), ("0", 0), (" 12 ", 12), ("off", None), ("OFF", None)]
)
def test_the_db_prepare_threshold_is_a_count_or_off(
    given: str, expected: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECEIVER_DB_PREPARE_THRESHOLD", given)
    assert Settings().db_prepare_threshold == expected
    assert env_prepare_threshold() == expected  # what the other commands open PostgreSQL with


@pytest.mark.parametrize("bad", ["-1", "sometimes", "2.5", ""])
def test_a_bad_db_prepare_threshold_is_said_in_our_words(tmp_path: Path, bad: str) -> None:
    allowed = "must be a whole number of executions, 0 or more, after which a statement is"
    served = CliRunner().invoke(cli, ["serve", "--db-prepare-threshold", bad])
    assert served.exit_code == 1
    assert f"RECEIVER_DB_PREPARE_THRESHOLD (--db-prepare-threshold): {allowed}" in served.output
    assert f"or off to never prepare (behind PgBouncer in transaction mode); got {bad!r}" in (
        served.output
    )
    # The commands beside the server read the variable alone, and say it the same way.
    env = {"RECEIVER_DB_PREPARE_THRESHOLD": bad}
    migrated = CliRunner(env=env).invoke(cli, ["db", "migrate", "--db", str(tmp_path / "r.db")])
    assert migrated.exit_code == 1
    assert migrated.output.startswith(f"Error: RECEIVER_DB_PREPARE_THRESHOLD: {allowed}")
    assert not (tmp_path / "r.db").exists()


@pytest.mark.e2e
def test_serve_still_needs_the_variables_that_check_does_not(tmp_path: Path) -> None:
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(
        'notifiers:\n  oncall: "slack://${SLACK_TOKEN_X}/#oncall"\n'
        "rules:\n  - name: all\n    notify: oncall\n"
    )
    result = CliRunner().invoke(cli, ["check", str(rules_file)], env={"SLACK_TOKEN_X": None})
    assert result.exit_code == 0, result.output
    code, out = _serve(tmp_path, "--rules", str(rules_file), "--port", str(free_port()))
    assert code == 1 and "environment variable SLACK_TOKEN_X is not set" in out


# -- logging -------------------------------------------------------------------------------


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    names = ["receiver", *logs.THIRD_PARTY, "uvicorn.error", "some.library"]
    saved = (root.handlers[:], root.level, {n: logging.getLogger(n).level for n in names})
    yield
    root.handlers[:], root.level = saved[0], saved[1]
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.usefixtures("restore_logging")
def test_debug_keeps_every_third_party_library_at_warning() -> None:
    logs.configure("text", "debug")
    assert logging.getLogger("receiver.router").isEnabledFor(logging.DEBUG)
    assert logging.getLogger("receiver.console").isEnabledFor(logging.INFO)
    libraries = ["uvicorn.error", "urllib3.connectionpool", "requests", "apprise", "httpcore"]
    for name in [*libraries, "watchfiles.main", "asyncio", "some.library"]:
        logger = logging.getLogger(name)
        assert not logger.isEnabledFor(logging.INFO), name
        assert logger.isEnabledFor(logging.WARNING), name


@pytest.mark.parametrize(
    ("args", "said"),
    [
        pytest.param(
            ["--workers", "2"],
            "RECEIVER_WORKERS (--workers) 2 needs RECEIVER_ADMIN (--admin) off",
            id="admin-on",
        ),
        pytest.param(
            ["--workers", "2", "--admin", "off", "--db", ":memory:"],
            "RECEIVER_WORKERS (--workers) 2 needs a database file or a postgresql:// URL;"
            " RECEIVER_DB ':memory:' is in memory",
            id="memory",
        ),
    ],
)
def test_workers_refuse_what_cannot_be_shared_between_processes(args: list[str], said: str) -> None:
    served = CliRunner().invoke(cli, ["serve", *args], env={"RECEIVER_ADMIN": None})
    assert served.exit_code == 2
    assert served.output.startswith(f"Error: {said}")


def test_workers_are_one_or_more() -> None:
    served = CliRunner().invoke(cli, ["serve", "--workers", "0"])
    assert served.exit_code == 1
    assert "RECEIVER_WORKERS (--workers): must be greater than or equal to 1" in served.output
