"""Off loopback the receiver refuses signing secrets anyone could know: the development
secret, every placeholder this repository shows, and secrets shorter than 16 characters."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from receiver.cli import cli
from receiver.errors import ConfigError
from receiver.settings import (
    DEV_SECRET,
    MIN_SECRET_LENGTH,
    PLACEHOLDER_SECRETS,
    Settings,
    weak_secret,
)

ROOT = Path(__file__).resolve().parent.parent
STRONG = "Zq7-long-enough-signing-secret"
UNIT = ROOT / "deploy" / "attention-receiver.service"

# Where a user copies a RECEIVER_SECRETS value from.
SHOWN_IN = [
    ROOT / "README.md",
    ROOT / "Dockerfile",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted(p for p in (ROOT / "deploy").rglob("*") if p.is_file()),
    *sorted((ROOT / "receiver" / "cli").glob("*.py")),
    *sorted((ROOT / "bench").glob("*.py")),
]
# RECEIVER_SECRETS=value, RECEIVER_SECRETS: "value", --from-literal=RECEIVER_SECRETS=value
_SHOWN = re.compile(r"""RECEIVER_SECRETS\s*[=:]\s*["']?([^"'\s`,)]*(?:,[^"'\s`,)]+)*)""")


def shown_values() -> set[str]:
    """Every value the repository's docs, deploy files and examples give RECEIVER_SECRETS,
    each secret of a rotation on its own, interpolations (${...}, $(...)) left out."""
    found: set[str] = set()
    for path in SHOWN_IN:
        for match in _SHOWN.finditer(path.read_text(encoding="utf-8", errors="replace")):
            for value in match.group(1).split(","):
                if value and not value.startswith("$"):
                    found.add(value)
    return found


def test_every_placeholder_shipped_is_refused_off_loopback() -> None:
    shown = shown_values()
    assert {"...", "s3cret", "new", "old", "4f1c..."} <= shown  # the scan finds them
    for value in shown:
        assert weak_secret(value) is not None, f"{value!r} is shown in the repository"
        with pytest.raises(ConfigError, match="RECEIVER_SECRETS"):
            Settings(host="0.0.0.0", secrets=value).check_exposure()


@pytest.mark.parametrize(
    ("secret", "why"),
    [
        pytest.param(DEV_SECRET, "is the public development secret", id="dev-secret-set"),
        pytest.param(
            "replace-with-the-webhook-signing-secret", "is a placeholder", id="old-k8s-placeholder"
        ),
        pytest.param(
            "REPLACE-WITH-THE-WEBHOOK-SIGNING-SECRET", "is a placeholder", id="placeholder-case"
        ),
        pytest.param("a", "is shorter than 16 characters", id="one-character"),
        pytest.param("x" * (MIN_SECRET_LENGTH - 1), "is shorter than 16", id="15-characters"),
    ],
)
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "example.com"])
def test_a_known_or_short_secret_is_refused_off_loopback(host: str, secret: str, why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings(host=host, secrets=secret).check_exposure()
    message = str(caught.value)
    assert message.startswith(f"RECEIVER_SECRETS {why}")
    assert f'"{host}" is not a loopback address' in message
    if len(secret) > 1:
        assert secret not in message  # never the secret itself


def test_each_secret_of_a_rotation_is_checked() -> None:
    with pytest.raises(ConfigError, match="^secret 2 of RECEIVER_SECRETS is shorter than 16"):
        Settings(host="0.0.0.0", secrets=f"{STRONG}, old-one").check_exposure()
    Settings(host="0.0.0.0", secrets=f"{STRONG},{STRONG}-previous").check_exposure()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5"])
def test_a_long_unknown_secret_allows_any_address(host: str) -> None:
    Settings(host=host, secrets="x" * MIN_SECRET_LENGTH).check_exposure()
    Settings(host=host, secrets=STRONG).check_exposure()


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_any_secret_is_allowed_on_loopback(host: str) -> None:
    for secret in ("a", "s3cret", DEV_SECRET, ""):
        Settings(host=host, secrets=secret).check_exposure()


def test_serve_refuses_a_short_secret_with_exit_2_without_printing_it() -> None:
    secret = "short-Secr3t"
    result = CliRunner().invoke(
        cli, ["serve", "--host", "0.0.0.0"], env={"RECEIVER_SECRETS": secret}
    )
    assert result.exit_code == 2
    assert "Error: RECEIVER_SECRETS is shorter than 16 characters" in result.output
    assert secret not in result.output


def test_the_k8s_secret_ships_no_usable_value() -> None:
    [doc] = [d for d in yaml.safe_load_all((ROOT / "deploy/k8s/secret.yaml").read_text()) if d]
    values = doc["stringData"]
    assert set(values) == {"RECEIVER_SECRETS", "RECEIVER_DB"}
    assert all(value == "" for value in values.values())
    with pytest.raises(ConfigError, match="RECEIVER_SECRETS is not set"):
        Settings(host="0.0.0.0", secrets=values["RECEIVER_SECRETS"]).check_exposure()


def _run_unit_check(secrets: str | None) -> subprocess.CompletedProcess[str]:
    """The unit's ExecStartPre as systemd runs it, with this virtualenv's python."""
    [line] = [x for x in UNIT.read_text().splitlines() if x.startswith("ExecStartPre=")]
    argv = shlex.split(line.removeprefix("ExecStartPre="))
    assert argv[0] == "/opt/attention-receiver/.venv/bin/python"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")}
    if secrets is not None:
        env["RECEIVER_SECRETS"] = secrets
    return subprocess.run(
        [sys.executable, *argv[1:]], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("secrets", "refused"),
    [
        pytest.param(None, "RECEIVER_SECRETS is not set", id="unset"),
        pytest.param(" , ", "RECEIVER_SECRETS is not set", id="blanks"),
        pytest.param("s3cret", "RECEIVER_SECRETS is a placeholder", id="placeholder"),
        pytest.param(f"{STRONG},old", "secret 2 of RECEIVER_SECRETS is a placeholder", id="old"),
        pytest.param("tooShort-2", "RECEIVER_SECRETS is shorter than 16", id="short"),
    ],
)
def test_the_systemd_unit_refuses_what_serve_refuses_off_loopback(
    secrets: str | None, refused: str
) -> None:
    """Behind a proxy on 127.0.0.1 the receiver is exposed, so the unit checks anyway."""
    result = _run_unit_check(secrets)
    assert result.returncode == 2
    assert result.stderr.startswith(f"Error: {refused}")
    assert "RestartPreventExitStatus=2" in UNIT.read_text().splitlines()
    assert "tooShort-2" not in result.stderr and STRONG not in result.stderr


def test_the_systemd_unit_starts_with_a_real_secret() -> None:
    result = _run_unit_check(f"{STRONG},{STRONG}-old")
    assert (result.returncode, result.stderr) == (0, "")


def test_the_unit_and_security_md_say_exactly_what_is_refused() -> None:
    unit = " ".join(x.lstrip("# ") for x in UNIT.read_text().splitlines() if x.startswith("#"))
    security = " ".join((ROOT / "docs" / "SECURITY.md").read_text().split())
    for text in (unit, security):
        for value in PLACEHOLDER_SECRETS:
            assert value in text, value
        assert f"shorter than {MIN_SECRET_LENGTH} characters" in text
        assert "exit status 2" in text


def test_the_dockerfile_listens_off_loopback_so_it_needs_a_strong_secret() -> None:
    env: dict[str, str] = {}
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("ENV "):
            env.update(item.partition("=")[::2] for item in line.split()[1:])
    assert "RECEIVER_SECRETS" not in env  # an image carries no secret
    for weak in ("", "s3cret", "a" * (MIN_SECRET_LENGTH - 1)):
        with pytest.raises(ConfigError, match="RECEIVER_SECRETS"):
            Settings(host=env["RECEIVER_HOST"], secrets=weak).check_exposure()
    Settings(host=env["RECEIVER_HOST"], secrets=STRONG).check_exposure()
