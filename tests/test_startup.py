"""Starting up: the development secret only on loopback, the built-in rules, `receiver init`.

The `serve` tests run the real `python -m receiver serve` in an empty folder on a free port.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from receiver import rules, signature
from receiver.app import from_env
from receiver.cli import cli
from receiver.errors import ConfigError
from receiver.settings import DEV_SECRET, Settings, is_loopback
from tests.harness import SECRET, STARTUP_TIMEOUT
from tests.servers import free_port

ROOT = Path(__file__).resolve().parent.parent
# Deadlines for conditions, generous for a busy machine (a wait that holds returns at once):
# a log line to appear, and a server to exit after SIGTERM (`serve`'s grace is 10 s).
WAIT = 30.0
STOP_TIMEOUT = 30.0


# --- loopback or not ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        pytest.param("127.0.0.1", True, id="ipv4-loopback"),
        pytest.param("127.3.2.1", True, id="ipv4-loopback-block"),
        pytest.param("::1", True, id="ipv6-loopback"),
        pytest.param("[::1]", True, id="ipv6-loopback-brackets"),
        pytest.param("localhost", True, id="localhost"),
        pytest.param("LocalHost", True, id="localhost-any-case"),
        pytest.param("0.0.0.0", False, id="every-ipv4-interface"),
        pytest.param("::", False, id="every-ipv6-interface"),
        pytest.param("10.0.0.5", False, id="private-address"),
        pytest.param("128.0.0.1", False, id="just-outside-127/8"),
        pytest.param("::ffff:127.0.0.1", False, id="ipv4-mapped"),
        pytest.param("example.com", False, id="other-name"),
        pytest.param("localhost.example.com", False, id="name-starting-localhost"),
        pytest.param("", False, id="empty"),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "example.com"])
def test_dev_secret_off_loopback_is_refused(host: str) -> None:
    with pytest.raises(ConfigError, match=f'RECEIVER_SECRETS is not set and .* "{host}"'):
        Settings(host=host, secrets="").check_exposure()
    with pytest.raises(ConfigError, match="RECEIVER_SECRETS"):
        Settings(host=host, secrets=" , ").check_exposure()  # blanks are no secret


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_dev_secret_on_loopback_is_allowed(host: str) -> None:
    Settings(host=host, secrets="").check_exposure()


def test_a_secret_allows_any_address() -> None:
    Settings(host="0.0.0.0", secrets=SECRET).check_exposure()


@pytest.mark.parametrize("host", ["::", "192.0.2.7", "example.com"])
def test_serve_refuses_with_exit_2_before_binding(host: str) -> None:
    result = CliRunner().invoke(cli, ["serve", "--host", host], env={"RECEIVER_SECRETS": ""})
    assert result.exit_code == 2
    assert "Error: RECEIVER_SECRETS is not set" in result.output
    assert f'"{host}" is not a loopback address' in result.output


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No RECEIVER_* from the outside; cwd an empty folder."""
    for name in list(os.environ):
        if name.startswith("RECEIVER_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RECEIVER_DB", str(tmp_path / "receiver.db"))
    # from_env() would point the root logger at this test's stderr for good.
    monkeypatch.setattr("receiver.logs.configure", lambda *args: None)
    return monkeypatch


def _factory_refusal(capsys: pytest.CaptureFixture[str]) -> str:
    """from_env() exits with uvicorn's startup-failure status; its message on stderr."""
    with pytest.raises(SystemExit) as exited:
        from_env()
    assert exited.value.code == 3
    assert isinstance(exited.value.__cause__, ConfigError)
    return capsys.readouterr().err


def test_factory_refuses_the_dev_secret_off_loopback(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clean_env.setenv("RECEIVER_HOST", "0.0.0.0")
    err = _factory_refusal(capsys)
    assert err.startswith('Error: RECEIVER_SECRETS is not set and RECEIVER_HOST (--host) "0.0.0.0"')


def test_factory_refuses_the_dev_secret_unless_told_the_host_is_loopback(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The factory cannot see uvicorn's --host, so without RECEIVER_HOST it fails closed."""
    err = _factory_refusal(capsys)
    assert err.startswith("Error: RECEIVER_SECRETS is not set: refusing to start")
    assert "set RECEIVER_HOST to the loopback address given to uvicorn --host" in err
    clean_env.setenv("RECEIVER_HOST", "127.0.0.1")
    assert from_env().state.rules.builtin


def test_factory_refuses_a_weak_secret_unless_told_the_host_is_loopback(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A short secret passed when RECEIVER_HOST was unset: uvicorn's --host 0.0.0.0 would
    then have taken deliveries signed with a guessable key."""
    clean_env.setenv("RECEIVER_SECRETS", "s3cr3t-9")
    err = _factory_refusal(capsys)
    assert err.startswith(
        "Error: RECEIVER_SECRETS is shorter than 16 characters, and RECEIVER_HOST is not set"
    )
    assert "s3cr3t-9" not in err
    clean_env.setenv("RECEIVER_HOST", "127.0.0.1")
    assert from_env().state.rules.builtin


def test_factory_refuses_a_missing_rules_file(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    clean_env.setenv("RECEIVER_SECRETS", SECRET)
    clean_env.setenv("RECEIVER_RULES", str(tmp_path / "missing.yaml"))
    err = _factory_refusal(capsys)
    assert "missing.yaml: cannot read rules file: no such file or directory" in err


@pytest.mark.e2e
def test_factory_refusal_stops_uvicorn_workers(tmp_path: Path) -> None:
    """Exit status 3 makes uvicorn's --workers parent stop instead of restarting workers."""
    argv = ["-m", "uvicorn", "--factory", "receiver.app:from_env", "--workers", "2"]
    _, _, err = _run_to_exit(tmp_path, _env(), *argv, "--port", str(free_port()))
    assert "Error: RECEIVER_SECRETS is not set" in err
    assert "failed to start, stopping the parent process" in err


def test_factory_starts_anywhere_with_a_secret(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("RECEIVER_SECRETS", SECRET)
    clean_env.setenv("RECEIVER_HOST", "0.0.0.0")
    assert from_env().state.rules.status()["path"] == "built-in"


# --- the real server -----------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
    return {**env, **extra}


def _serve(cwd: Path, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    log = (cwd / "serve.log").open("ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "receiver", "serve", *args],
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=log,
        )
    finally:
        log.close()


def _stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then SIGKILL if it is still there after STOP_TIMEOUT; the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(10)


def _run_to_exit(cwd: Path, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """`python ARGS` run until it exits by itself, as a refusal to start does: its exit
    status, stdout and stderr. Still running after STARTUP_TIMEOUT, it is stopped and the
    test fails; its pipes are closed either way."""
    with subprocess.Popen(
        [sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as proc:
        try:
            out, err = proc.communicate(timeout=STARTUP_TIMEOUT)
        except subprocess.TimeoutExpired:
            _stop(proc)
            raise AssertionError(
                f"{' '.join(args)} still running after {STARTUP_TIMEOUT:g}s; stopped it"
            ) from None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Every server a test starts goes in here, and is stopped whatever happens."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for proc in started:
            _stop(proc)


def _wait_healthy(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"receiver exited {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise AssertionError(f"receiver did not start in {STARTUP_TIMEOUT}s:\n{log.read_text()}")


def _wait_for_line(log: Path, text: str, timeout: float = WAIT) -> str:
    deadline = time.monotonic() + timeout
    while True:
        for line in log.read_text(errors="replace").splitlines():
            if text in line:
                return line
        if time.monotonic() >= deadline:
            raise AssertionError(f"no line with {text!r} in {timeout}s:\n{log.read_text()}")
        time.sleep(0.05)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.e2e
def test_serve_on_every_interface_without_a_secret_exits_2(tmp_path: Path) -> None:
    port = free_port()
    serve = ("-m", "receiver", "serve", "--port", str(port))
    code, out, message = _run_to_exit(tmp_path, _env(RECEIVER_HOST="0.0.0.0"), *serve)
    assert code == 2
    assert message.startswith("Error: RECEIVER_SECRETS is not set"), message
    assert '"0.0.0.0" is not a loopback address' in message
    assert "receiving on" not in message
    assert out == ""
    assert not _listening(port)
    assert list(tmp_path.iterdir()) == []  # no database, nothing written


@pytest.mark.e2e
def test_serve_on_every_interface_with_a_secret_starts(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    port = free_port()
    proc = _serve(tmp_path, _env(RECEIVER_SECRETS=SECRET), "--host", "0.0.0.0", "--port", str(port))
    procs.append(proc)
    _wait_healthy(proc, port, tmp_path / "serve.log")
    assert _stop(proc) == 0  # a clean stop
    log = (tmp_path / "serve.log").read_text()
    assert f"receiving on http://0.0.0.0:{port}/v1/events" in log
    assert "NO RECEIVER_SECRETS SET" not in log
    assert "store closed" in log


@pytest.mark.e2e
def test_zero_config_serves_on_the_built_in_rules_then_adopts_init(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    """An empty folder, no settings: loopback, development secret, built-in rules."""
    port = free_port()
    log = tmp_path / "serve.log"
    proc = _serve(tmp_path, _env(), "--port", str(port))
    procs.append(proc)
    _wait_healthy(proc, port, log)

    startup = _wait_for_line(log, "receiving on")
    assert f"receiving on http://127.0.0.1:{port}/v1/events" in startup
    assert "2 rules from the built-in rules (no rules.yaml" in startup
    assert "receiver init" in startup
    _wait_for_line(log, "NO RECEIVER_SECRETS SET")  # the warning stays, on loopback
    ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).json()
    assert ready["checks"]["rules"]["path"] == "built-in"

    now = time.gmtime()  # within the age and clock-skew limits
    body = json.dumps(
        {
            "id": "evt_zero_1",
            "type": "score.drop",
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", now),
            "sessionId": "sess_demo",
            "userId": "user_42",
            "score": 22,
            "threshold": 40,
        }
    ).encode()
    headers = {signature.SIGNATURE_HEADER: signature.sign(DEV_SECRET.encode(), body)}
    answer = httpx.post(f"http://127.0.0.1:{port}/v1/events", content=body, headers=headers)
    assert answer.status_code == 202
    line = _wait_for_line(log, "receiver.console")
    assert "Attention dropped for user_42: 22 (threshold 40)" in line
    at = time.strftime("%H:%M", now)
    assert f"Session sess_demo fell 18 below the threshold at {at} UTC." in line

    # `receiver init` in the same folder: the running server switches to the file.
    assert CliRunner().invoke(cli, ["init", str(tmp_path / "rules.yaml")]).exit_code == 0
    _wait_for_line(log, "replacing the built-in rules")
    ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).json()
    assert ready["checks"]["rules"]["path"] == "rules.yaml"
    assert _stop(proc) == 0  # a clean stop
    assert "store closed" in log.read_text()


@pytest.mark.e2e
def test_a_missing_rules_file_named_by_receiver_rules_fails_clearly(tmp_path: Path) -> None:
    missing = tmp_path / "conf" / "rules.yaml"
    serve = ("-m", "receiver", "serve", "--port", str(free_port()))
    code, _, message = _run_to_exit(tmp_path, _env(RECEIVER_RULES=str(missing)), *serve)
    assert code == 1
    assert f"Error: {missing}: cannot read rules file: no such file or directory" in message
    assert f"RECEIVER_RULES (--rules) names this file: create it (`receiver init {missing}`)" in (
        message
    )
    assert "receiving on" not in message


def test_an_explicit_default_path_must_exist_too(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setenv("RECEIVER_RULES", "./rules.yaml")
    assert Settings().rules_file == Path("rules.yaml")
    clean_env.delenv("RECEIVER_RULES")
    assert Settings().rules_file is None
    (tmp_path / "rules.yaml").write_text("rules: []\n")
    assert Settings().rules_file == Path("rules.yaml")


# --- receiver init and check ---------------------------------------------------------------


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), env={"RECEIVER_RULES": None})
    return result.exit_code, result.output


def test_init_writes_a_starter_that_check_accepts(clean_env: pytest.MonkeyPatch) -> None:
    code, out = invoke("init")
    assert code == 0
    assert out.splitlines() == [
        "wrote rules.yaml: 2 rules, every event to the console",
        "next: edit it, run `receiver check`, then `receiver serve` (a server already running"
        " here on the built-in rules switches to it at once)",
    ]
    assert Path("rules.yaml").read_text() == rules.starter_text()
    code, out = invoke("check")
    assert code == 0 and out.startswith("rules.yaml: OK\n")
    assert "score-drop -> console" in out and "everything-else -> console" in out


def test_init_never_overwrites(clean_env: pytest.MonkeyPatch) -> None:
    Path("rules.yaml").write_text("mine\n")
    code, out = invoke("init")
    assert code == 1
    assert out == (
        "Error: rules.yaml already exists; not overwriting it (move it away, or give another"
        " PATH)\n"
    )
    assert Path("rules.yaml").read_text() == "mine\n"


def test_init_to_another_path_says_how_to_use_it(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    target = tmp_path / "conf.yaml"
    code, out = invoke("init", str(target))
    assert code == 0
    assert f"`receiver serve --rules {target}` (or RECEIVER_RULES={target})" in out
    assert invoke("check", str(target))[0] == 0
    code, out = invoke("init", str(tmp_path / "no-such-dir" / "rules.yaml"))
    assert code == 1 and "cannot write" in out and "no such file or directory" in out


def test_check_without_a_file_names_the_built_in_rules(clean_env: pytest.MonkeyPatch) -> None:
    code, out = invoke("check")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == (
        "no rules.yaml and no RECEIVER_RULES: `receiver serve` would use the built-in rules"
        " below (`receiver init` writes them to rules.yaml)"
    )
    assert lines[1] == "built-in rules: OK"
    assert lines[2].startswith("built-in rules: 2 rules, 1 notifier")


def test_built_in_rules_are_the_shipped_rules_file() -> None:
    """One text: the starter `receiver init` writes is rules.yaml at the top of the repo."""
    assert rules.starter_text() == (ROOT / "rules.yaml").read_text(encoding="utf-8")
    builtin = rules.load_builtin()
    assert builtin.source == rules.BUILTIN_SOURCE
    assert builtin.digest == rules.load_file(ROOT / "rules.yaml", env={}).digest


# --- the deployment files ------------------------------------------------------------------


def test_the_dockerfile_listens_off_loopback_so_it_needs_a_secret() -> None:
    env: dict[str, str] = {}
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("ENV "):
            for item in line.split()[1:]:
                key, _, value = item.partition("=")
                env[key] = value
    assert "RECEIVER_SECRETS" not in env  # an image carries no secret
    with pytest.raises(ConfigError, match="RECEIVER_SECRETS is not set"):
        Settings(host=env["RECEIVER_HOST"], secrets="").check_exposure()
    Settings(host=env["RECEIVER_HOST"], secrets=SECRET).check_exposure()


# The systemd unit's ExecStartPre: tests/test_exposure.py runs it.


def test_the_starters_escalation_example_loads_once_uncommented() -> None:
    """The commented escalation, its rule and the notifiers they name are a working file
    when a user removes the `# ` before them."""
    wanted = ("# slack:", "# pagerduty:", "# escalations:", "#   ", "# - name")
    lines = []
    for line in rules.starter_text().splitlines():
        stripped = line.lstrip()
        if stripped.startswith(wanted) and not stripped.startswith("#   deep-drop"):
            indent = line[: len(line) - len(stripped)]
            lines.append(indent + stripped[2:])
        else:
            lines.append(line)
    loaded = rules.load_text("\n".join(lines), env={}, lenient_env=True)
    deep = loaded.by_name["deep-drop"]
    assert deep.escalate is not None and deep.escalate.name == "wake-someone"
    assert [s.notify for s in deep.escalate.steps] == [("slack",), ("pagerduty",)]
    assert deep.escalate.reack == 1800
