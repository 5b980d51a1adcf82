"""No secret in any log line at DEBUG or in any CLI output, through a full scenario."""

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from receiver import events
from receiver.cli import cli
from tests.harness import Receiver, signed
from tests.servers import HTTPSink, SMTPSink

pytestmark = pytest.mark.e2e

SIGNING = "sign-S3cret-0c5e"
OLD_SIGNING = "old-sign-S3cret-9ab1"
HOOK_PASSWORD = "hook-pw-S3cret-71"
CHAT_TOKEN = "chattoken-S3cret-42"
BAD_TOKEN = "bad-reload-S3cret-13"


def rules(http: HTTPSink, smtp: SMTPSink) -> str:
    return f"""
notifiers:
  hook: "json://ops:{HOOK_PASSWORD}@127.0.0.1:{http.port}/hook"
  chat: "{http.mattermost_url(CHAT_TOKEN)}"
  mail: "{smtp.mailto_url()}"
rules:
  - name: deep-drop
    match: {{type: score.drop}}
    notify: [hook, chat, mail]
"""


def test_no_secret_in_logs_or_cli_output_at_debug(
    tmp_path: Path, http_sink: HTTPSink, smtp_sink: SMTPSink
) -> None:
    secrets = [SIGNING, OLD_SIGNING, HOOK_PASSWORD, CHAT_TOKEN, smtp_sink.password, BAD_TOKEN]
    server = Receiver(
        tmp_path,
        rules=rules(http_sink, smtp_sink),
        secret=SIGNING,
        env={"RECEIVER_SECRETS": f"{SIGNING},{OLD_SIGNING}", "RECEIVER_LOG_LEVEL": "debug"},
    ).start()
    try:
        http_sink.fail_with(500)  # failures and retries get logged
        for i, secret in enumerate([SIGNING, OLD_SIGNING, "forged", SIGNING[:-1]]):
            body = json.dumps(events.sample("score.drop", id=f"evt_s{i}")).encode()
            server.post(body, signed(body, secret))
        server.post(b'{"id": "evt_bad"}', signed(b'{"id": "evt_bad"}', SIGNING))  # quarantined
        server.post(b"{}")  # unsigned
        http_sink.wait_for(4)
        smtp_sink.wait_for(2)
        http_sink.ok()
        http_sink.wait_for(8, timeout=15)
        # A bad reload whose text carries a token must not echo it.
        server.rules.write_text(
            f'notifiers:\n  x: "json://u:{BAD_TOKEN}@127.0.0.1/"\nrules:\n  - name: y\n'
            f"    notify: [nobody]\n    title: {BAD_TOKEN}\n"
        )
        deadline = time.monotonic() + 10
        while "rules reload refused" not in server.logs() and time.monotonic() < deadline:
            time.sleep(0.1)
        runner = CliRunner()
        outputs = [
            runner.invoke(cli, ["deliveries", "--db", str(server.db)]).output,
            runner.invoke(cli, ["deliveries", "--db", str(server.db), "--json"]).output,
            runner.invoke(cli, ["check", str(server.rules)]).output,
            runner.invoke(cli, ["explain", "--rules", str(server.rules)]).output,
            server.get("/readyz").text,
            server.get("/metrics").text,
        ]
        server.rules.write_text(rules(http_sink, smtp_sink))
        outputs += [
            runner.invoke(cli, ["check", str(server.rules)]).output,
            runner.invoke(cli, ["explain", "--rules", str(server.rules)]).output,
        ]
    finally:
        server.stop()
    logs = server.logs()
    assert "rules reload refused" in logs and "delivered" in logs and "DEBUG" in logs
    for secret in secrets:
        assert secret not in logs, f"{secret} in the log"
        for out in outputs:
            assert secret not in out, f"{secret} in CLI output: {out[:300]}"
