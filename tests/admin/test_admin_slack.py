"""The admin page shows dead Slack buttons: the Notifications page counts the Slack app's
clicks by outcome, refused ones among them, once there are any."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from receiver.simulator.slack_api import signed
from tests.admin.test_views import running

PAYLOAD = {"type": "block_actions", "user": {"id": "U1"}, "actions": []}


def test_the_notifications_page_counts_slack_clicks_refused_and_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECEIVER_SLACK_SIGNING_SECRET", "signing-secret-0123")

    async def main() -> tuple[str, str, list[int]]:
        async with running(tmp_path, "console://") as admin:
            before = await admin.page("/admin/notifications")
            statuses = []
            for secret in ("signing-secret-0123", "wrong-secret", "wrong-secret"):
                body, headers = signed(PAYLOAD, secret)
                answer = await admin.client.post(
                    "/slack/interactivity", content=body, headers=headers
                )
                statuses.append(answer.status_code)
            return before, await admin.page("/admin/notifications"), statuses

    before, after, statuses = asyncio.run(main())
    assert statuses == [200, 401, 401]
    assert "Slack buttons" not in before
    assert "Slack buttons" in after
    assert "invalid_signature</span> 2" in after
