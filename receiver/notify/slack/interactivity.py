"""POST /slack/interactivity: the Slack app's buttons (Ack, Resolve, Snooze 1h) answering
back. Slack posts each click to the app's request URL, form-encoded, one field `payload`
holding the block_actions JSON.

Before anything is parsed, the raw body (capped at RECEIVER_MAX_BODY) must carry Slack's
v0 signature under RECEIVER_SLACK_SIGNING_SECRET (slack_sdk's SignatureVerifier), dated
within 5 minutes: otherwise 401 (`missing_signature`, `invalid_signature`), counted in
receiver_slack_interactions_total{outcome} and logged, a few lines a minute per address.
Without a signing secret every click answers 404 `slack_not_configured`.

Slack wants an answer within 3 seconds, so the endpoint answers 200 at once and acts after
the answer is sent (Starlette's background task of the request: uvicorn lets it finish on
shutdown; its failure is caught, logged and counted as "failed"). The click's button
carries the episode's signed action token (receiver.links), and the action goes through
the one action engine (receiver.dispatch.actions), recorded with source `slack` and the
Slack user as who ("<@U123> (ada)"); the action queues the update of every message of the
episode (receiver.dispatch.updates), this one included, which the worker sends; a click
that changed nothing gets its note on the clicked message at once. A delivery
Slack retries (X-Slack-Retry-Num) acts once: each click is noted in the store first.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from receiver.dispatch import actions
from receiver.links import LinkError, LinkExpiredError, Links, LinkSource
from receiver.logs import LogLimiter
from receiver.metrics import Metrics
from receiver.notify.episodes import Episode
from receiver.notify.slack import blocks
from receiver.notify.slack.channel import Messenger, SendError, rendered, state_of
from receiver.store import Store
from receiver.store.base import Tx

if TYPE_CHECKING:
    from slack_sdk.signature import SignatureVerifier

log = logging.getLogger("receiver.slack")

PATH = "/slack/interactivity"
MAX_AGE = 300  # Slack's own bound on a request's timestamp, seconds
_CLICK = "slack.click."  # the store's named state noting a click acted on


def _error(status: int, code: str, message: str) -> Response:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


class Interactivity:
    """The endpoint; see the module's docstring."""

    def __init__(
        self,
        store: Store,
        *,
        signing_secret: str | None,
        messenger: Messenger,
        links: Callable[[], Any],  # async () -> Links, the action tokens' signer
        link_source: LinkSource | None,  # the resolve's messages' links, if on
        rules: Callable[[], Any],
        metrics: Metrics,
        max_body: int,
        wake_worker: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.verifier: SignatureVerifier | None = None
        if signing_secret:  # slack_sdk is imported where the app is set up, not by every start
            from slack_sdk.signature import SignatureVerifier

            self.verifier = SignatureVerifier(signing_secret)
        self.messenger = messenger
        self.links = links
        self.link_source = link_source
        self.rules = rules
        self.counted = metrics.slack_interactions
        self.max_body = max_body
        self.wake_worker = wake_worker
        self.clock = clock
        self.refused_log = LogLimiter(log)

    def routes(self) -> list[Route]:
        return [Route(PATH, self.interact, methods=["POST"])]

    def _refused(
        self, request: Request, outcome: str, status: int, code: str, why: str
    ) -> Response:
        self.counted[outcome].inc()
        address = request.client.host if request.client else "-"
        self.refused_log.warning(
            f"slack {outcome}",
            address,
            "slack click from %s refused: %s (%s)",
            address,
            code,
            why,
            extra={"code": code, "client": address},
        )
        return _error(status, code, why)

    async def interact(self, request: Request) -> Response:
        if self.verifier is None:
            return self._refused(
                request,
                "not_configured",
                404,
                "slack_not_configured",
                "the Slack app's buttons are off: set RECEIVER_SLACK_SIGNING_SECRET",
            )
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_body:
                return self._refused(
                    request,
                    "invalid_request",
                    413,
                    "payload_too_large",
                    f"the body is over {self.max_body} bytes",
                )
        stamp = request.headers.get("x-slack-request-timestamp")
        signature = request.headers.get("x-slack-signature")
        if not stamp or not signature:
            return self._refused(
                request,
                "invalid_signature",
                401,
                "missing_signature",
                "X-Slack-Signature and X-Slack-Request-Timestamp are required",
            )
        if not stamp.isdigit() or abs(time.time() - int(stamp)) > MAX_AGE:
            return self._refused(
                request,
                "expired_timestamp",
                401,
                "invalid_signature",
                "X-Slack-Request-Timestamp is not within 5 minutes of now",
            )
        if not self.verifier.is_valid(bytes(body), stamp, signature):
            return self._refused(
                request,
                "invalid_signature",
                401,
                "invalid_signature",
                "X-Slack-Signature does not match the body under the signing secret",
            )
        try:
            [raw] = parse_qs(body.decode(), strict_parsing=True)["payload"]
            payload = json.loads(raw)
            if not isinstance(payload, dict):
                raise ValueError("payload is not an object")
        except (ValueError, KeyError, UnicodeDecodeError):
            return self._refused(
                request,
                "invalid_request",
                400,
                "invalid_request",
                "expected a form with one field, payload, holding a JSON object",
            )
        retried = request.headers.get("x-slack-retry-num") is not None
        return Response(status_code=200, background=BackgroundTask(self._act, payload, retried))

    async def _act(self, payload: dict[str, Any], retried: bool) -> None:
        """Act on a verified click and update its message; never raises."""
        try:
            outcome = await self.act(payload, retried)
        except Exception:
            log.exception("slack click failed")
            outcome = "failed"
        self.counted[outcome].inc()

    async def act(self, payload: dict[str, Any], retried: bool) -> str:
        """What a verified click came to (its outcome label)."""
        click = _click(payload)
        if click is None:
            return "ignored"
        action_id, token, user, channel_id, ts, click_id = click
        if not await self._first(click_id):
            log.info("slack: a retried click (%s) was acted on already", action_id)
            return "retried"
        links: Links = await self.links()
        try:
            claim = links.read(token)
        except LinkExpiredError:
            await self._note(channel_id, ts, None, f"{user}: this button has expired")
            return "stale"
        except LinkError:
            return "invalid_request"
        outcome = await actions.perform(
            self.store,
            self.rules(),
            claim.alert,
            claim.action,
            source="slack",
            by=user,
            now=self.clock(),
            episode=claim.episode,
            links=self.link_source,
        )
        self.wake_worker()
        log.info("slack: %s %s by %s: %s", claim.action, claim.alert, user, outcome.result)
        if outcome.result == "done":
            # The action queued its messages' updates (an ack's or a snooze's "update"
            # rows, a resolve's resolved messages): the worker updates this one with the
            # others, once, whichever replica or retry got the click.
            return outcome.result
        note = f"{blocks.mention(user)}: {outcome.message}"
        episode = await episode_now(self.store, claim.alert, claim.episode or outcome.episode)
        await self._note(channel_id, ts, episode, note)
        return "stale" if outcome.result == "missing" else outcome.result

    async def _first(self, click_id: str) -> bool:
        """Note the click in the store; False if it was noted already (a retry)."""
        name = _CLICK + click_id

        def note(tx: Tx) -> bool:
            if tx.state.get(name) is not None:
                return False
            tx.state.set(name, self.clock())
            return True

        return bool(await self.store.transact(note))

    async def _note(
        self, channel_id: str, ts: str, episode: Episode | None, note: str | None
    ) -> None:
        """Show the episode's state now (and note) on the message that was clicked."""
        thread = await self.store.threads.find(channel_id, ts)
        if thread is None:
            log.info("slack: a click on a message this store does not know")
            return
        links = await self.links()
        card = dict(thread.card)
        if episode is not None:
            card = await state_of(self.store, card, episode, note)
        elif note:
            card["note"] = note
        if episode is None:
            episode = Episode(str(card.get("alert")), int(card.get("episode") or 0), "resolved")
        text, msg_blocks = rendered(card, links, episode, links.base or None)
        try:
            await self.messenger.update(channel_id, ts, text, msg_blocks)
        except SendError as exc:
            log.warning("slack: could not update the clicked message: %s", exc)
            raise
        await self.store.threads.update(thread.key, thread.target, card=card, now=self.clock())


def _click(payload: dict[str, Any]) -> tuple[str, str, str, str, str, str] | None:
    """(action_id, token, who, channel id, message ts, click id) of a click on one of our
    buttons, or None for anything else (the Open link's click, another interaction)."""
    if payload.get("type") != "block_actions":
        return None
    acts = payload.get("actions") or []
    action = acts[0] if acts and isinstance(acts[0], dict) else {}
    action_id, token = action.get("action_id"), action.get("value")
    if action_id not in blocks.BUTTONS or not isinstance(token, str):
        return None
    user = payload.get("user") or {}
    channel = (payload.get("channel") or {}).get("id") or (payload.get("container") or {}).get(
        "channel_id"
    )
    ts = (payload.get("message") or {}).get("ts") or (payload.get("container") or {}).get(
        "message_ts"
    )
    if not isinstance(user, dict) or not channel or not ts:
        return None
    name = user.get("username") or user.get("name")
    who = f"<@{user.get('id')}>" + (f" ({name})" if name else "")
    seen = f"{user.get('id')}|{action.get('action_ts')}|{action_id}|{channel}|{ts}"
    return str(action_id), token, who, str(channel), str(ts), _digest(seen)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


async def episode_now(store: Store, alert_id: str, episode: int | None) -> Episode | None:
    """The episode of an alert as it stands now, as receiver.notify.episodes tells a row's
    (None when the alert is gone)."""
    alert = await store.alerts.get(alert_id)
    if alert is None:
        return None
    number = alert.episode if episode is None else episode
    current = alert.episode == number and alert.state == "open"
    ack = (await store.alerts.acks([alert_id])).get((alert_id, number))
    snoozes = [
        a.until
        for a in await store.alerts.actions([alert_id])
        if a.episode == number and a.action == "snooze" and a.outcome == "done"
        if a.until is not None
    ]
    return Episode(
        alert=alert_id,
        episode=number,
        state="open" if current else "resolved",
        acked_by=ack.acked_by if ack else None,
        acked_at=ack.acked_at if ack else None,
        snoozed_until=snoozes[-1] if snoozes else None,
    )
