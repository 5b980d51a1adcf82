"""deploy/compose.yaml and deploy/k8s/ against the code: the settings they set exist, the
probes hit real endpoints, the ports and grace periods fit the receiver's own."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from receiver.app import create_app
from receiver.edge.ops import STORE_DEADLINE
from receiver.rules import parse_duration
from receiver.settings import Settings

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
SETTINGS = {f"RECEIVER_{name.upper()}" for name in Settings.model_fields}


@pytest.fixture(scope="module")
def routes(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    db = tmp_path_factory.mktemp("deploy") / "r.db"
    app = create_app(Settings(db=str(db), secrets="s"))
    return {route.path for route in app.routes}  # type: ignore[attr-defined]


def seconds(value: Any) -> float:
    return float(value) if str(value).isdigit() else parse_duration(str(value))


def load_compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return data


def receivers(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if n.startswith("receiver")}


def test_compose_runs_two_receivers_on_postgres_behind_a_balancer(routes: set[str]) -> None:
    compose = load_compose()
    replicas = receivers(compose)
    assert len(replicas) == 2 and {"postgres", "lb"} <= compose["services"].keys()
    for name, service in replicas.items():
        env = service["environment"]
        assert set(env) <= SETTINGS, f"{name}: unknown settings {set(env) - SETTINGS}"
        assert (
            env["RECEIVER_DB"].startswith("postgresql://")
            and "@postgres:5432/" in (env["RECEIVER_DB"])
        )
        assert "${RECEIVER_SECRETS:?" in env["RECEIVER_SECRETS"]  # from the environment, required
        assert env["RECEIVER_HOST"] == "0.0.0.0"
        probe = " ".join(service["healthcheck"]["test"])
        path = re.search(r"127\.0\.0\.1:(\d+)(/\w+)", probe)
        assert path is not None and path.group(2) in routes
        assert path.group(1) == env["RECEIVER_PORT"]
        assert seconds(service["stop_grace_period"]) > seconds(env["RECEIVER_SHUTDOWN_GRACE"])
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_the_balancer_sends_to_every_replica_and_retries_posts() -> None:
    compose = load_compose()
    conf = (DEPLOY / "nginx.conf").read_text()
    upstream = set(re.findall(r"server (receiver-\d+):(\d+)", conf))
    ports = {(n, s["environment"]["RECEIVER_PORT"]) for n, s in receivers(compose).items()}
    assert upstream == ports
    assert "non_idempotent" in conf  # a POST refused by a stopping replica goes to the next
    limit = re.search(r"client_max_body_size (\d+)k", conf)
    assert limit is not None and int(limit.group(1)) * 1024 == Settings().max_body


def test_compose_config_validates_with_the_docker_client(tmp_path: Path) -> None:
    command = None
    if shutil.which("docker-compose"):
        command = ["docker-compose"]
    elif shutil.which("docker") and (
        subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    ):
        command = ["docker", "compose"]
    if command is None:
        pytest.skip("no docker compose client here; the file's structure is checked above")
    done = subprocess.run(
        [*command, "-f", str(DEPLOY / "compose.yaml"), "config"],
        capture_output=True,
        text=True,
        env={"POSTGRES_PASSWORD": "pw", "RECEIVER_SECRETS": "s", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr


def k8s(kind: str) -> dict[str, Any]:
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == kind:
                return dict(doc)
    raise AssertionError(f"no {kind} in deploy/k8s")


def test_k8s_deployment_fits_the_receiver(routes: set[str]) -> None:
    deployment = k8s("Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    [container] = spec["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert set(env) <= SETTINGS, f"unknown settings {set(env) - SETTINGS}"
    secret = k8s("Secret")
    for name in ("RECEIVER_SECRETS", "RECEIVER_DB"):
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz" in routes
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz" in routes
    # /readyz's store check has its own deadline, well inside the probe's.
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["timeoutSeconds"] >= 2 * STORE_DEADLINE
    [port] = container["ports"]
    assert str(port["containerPort"]) == env["RECEIVER_PORT"]["value"]
    pause = float(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    grace = seconds(env["RECEIVER_SHUTDOWN_GRACE"]["value"])
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] > pause + grace


def test_k8s_service_and_budget_select_the_deployment() -> None:
    labels = k8s("Deployment")["spec"]["template"]["metadata"]["labels"]
    service, budget = k8s("Service"), k8s("PodDisruptionBudget")
    assert service["spec"]["selector"].items() <= labels.items()
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert budget["spec"]["minAvailable"] == 1
    [port] = service["spec"]["ports"]
    assert port["targetPort"] == "http"


# --- hardening (issue 28, item 17) ---------------------------------------------------------

UNIT = DEPLOY / "attention-receiver.service"
DOCKERFILE = DEPLOY.parent / "Dockerfile"
# What the unit must keep: each lowers `systemd-analyze security`'s exposure score.
HARDENING = {
    "NoNewPrivileges": "true",
    "ProtectSystem": "strict",
    "ProtectHome": "true",
    "PrivateTmp": "true",
    "PrivateDevices": "true",
    "PrivateMounts": "true",
    "ProtectKernelTunables": "true",
    "ProtectKernelModules": "true",
    "ProtectKernelLogs": "true",
    "ProtectControlGroups": "true",
    "ProtectClock": "true",
    "ProtectHostname": "true",
    "RestrictNamespaces": "true",
    "RestrictRealtime": "true",
    "RestrictSUIDSGID": "true",
    "LockPersonality": "true",
    "CapabilityBoundingSet": "",
    "SystemCallArchitectures": "native",
    "UMask": "0077",
}


def unit_directives() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_the_systemd_unit_is_hardened() -> None:
    found = unit_directives()
    for key, value in HARDENING.items():
        assert found.get(key) == [value], f"{key}={value} in the unit"
    assert found["User"] != ["root"]
    assert set(found["RestrictAddressFamilies"][0].split()) == {"AF_INET", "AF_INET6", "AF_UNIX"}
    assert "@system-service" in found["SystemCallFilter"]
    # The one place it writes is the database's directory, where RECEIVER_DB points.
    assert found["ReadWritePaths"] == ["/var/lib/attention-receiver"]
    assert "RECEIVER_DB=/var/lib/attention-receiver/receiver.db" in found["Environment"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_analyze_rates_the_unit_under_5(tmp_path: Path) -> None:
    run = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", run.stdout)
    assert found, run.stdout + run.stderr
    assert float(found.group(1)) < 5, run.stdout


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    lines = [x.strip() for x in text.splitlines() if x.strip() and not x.startswith("#")]
    return [(x.split(None, 1)[0].upper(), x.split(None, 1)[1]) for x in lines]


def test_the_dockerfile_runs_as_a_numeric_user_with_an_exec_form_healthcheck() -> None:
    found = dockerfile_instructions()
    [user] = [args for name, args in found if name == "USER"]
    assert re.fullmatch(r"[1-9]\d*:[1-9]\d*", user), f"USER {user}: numeric uid:gid, not root"
    [check] = [args for name, args in found if name == "HEALTHCHECK"]
    argv = json.loads(check[check.index("CMD ") + 4 :])  # exec form: a JSON array
    assert argv[:2] == ["python", "-c"] and "/readyz" in argv[2]
    uid, gid = user.split(":")
    [run] = [args for name, args in found if name == "RUN" and "useradd" in args]
    assert f"--uid {uid}" in run and f"--gid {gid}" in run


def test_the_k8s_pod_runs_unprivileged_on_a_read_only_root() -> None:
    spec = k8s("Deployment")["spec"]["template"]["spec"]
    pod = spec["securityContext"]
    uid, gid = next(a for n, a in dockerfile_instructions() if n == "USER").split(":")
    assert pod["runAsNonRoot"] is True
    assert (pod["runAsUser"], pod["runAsGroup"]) == (int(uid), int(gid))
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = spec["containers"]
    ctx = container["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False and ctx["privileged"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    # Read-only root: what it writes goes to an emptyDir (/tmp) or PostgreSQL (RECEIVER_DB).
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert {e["name"] for e in container["env"]} >= {"RECEIVER_DB"}
