"""The Slack app channel's sending half: one message per alert episode, posted by the app's
bot (chat.postMessage), updated in place by every later notification of the episode
(chat.update) with a threaded reply for the record; rows of no episode posted as they are.

Two senders at once (two replicas; two notifiers naming one channel) must not post one
episode's first message twice: the outbox sends one alert's rows to one target in order,
but not across notifiers, and a lease that ran out lets a row be sent again; so each first
post is claimed in the store first (store.threads), and a sender finding the claim held
tries again shortly, by then to update the message the other posted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from receiver.notify import apprise
from receiver.notify.channel import Result, Schedule
from receiver.notify.slack import blocks
from receiver.notify.slack.url import SlackURL, parse
from receiver.store import OutboxRow, Store

if TYPE_CHECKING:
    from slack_sdk.web.async_client import AsyncWebClient

    # imported when sending: the links reach the rules, whose notifiers this is
    from receiver.links import Links
    from receiver.notify.episodes import Episode

NAME = "slack-app"
CLAIM_LEASE = 60.0  # how long a first post may take before another sender takes it over
BUSY_RETRY = 2.0  # seconds before a sender that found the first post claimed looks again


class SendError(Exception):
    """A Web API call failed: error is Slack's error code (or the transport's failure)."""

    def __init__(self, method: str, error: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"slack {method}: {error}")
        self.error = error
        self.retry_after = retry_after


class Messenger:
    """The Web API calls the channel and the button endpoint make, with the bot token."""

    def __init__(self, token: str | None, base_url: str, timeout: float) -> None:
        self.token = token
        self.base_url = base_url
        self.timeout = timeout

    def client(self) -> AsyncWebClient:
        # slack_sdk's async client and aiohttp are imported by the first call: a fifth of
        # the server's start, spent only where a slack-app:// notifier sends.
        from slack_sdk.web.async_client import AsyncWebClient

        if not self.token:
            raise SendError("client", "RECEIVER_SLACK_BOT_TOKEN is not set")
        return AsyncWebClient(
            token=self.token, base_url=self.base_url, timeout=max(1, round(self.timeout))
        )

    async def call(self, method: str, **args: Any) -> dict[str, Any]:
        """The answer of Web API method (chat.postMessage ...); SendError when not ok."""
        import aiohttp
        from slack_sdk.errors import SlackApiError

        try:
            answer = await self.client().api_call(method, json=args)
        except SlackApiError as exc:
            data = exc.response.data if isinstance(exc.response.data, dict) else {}
            error = str(data.get("error") or f"HTTP {exc.response.status_code}")
            wait = exc.response.headers.get("Retry-After") if exc.response.headers else None
            retry_after = float(wait) if wait and str(wait).isdigit() else None
            raise SendError(method, error, retry_after=retry_after) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise SendError(method, type(exc).__name__) from exc
        return dict(answer.data) if isinstance(answer.data, dict) else {}

    async def post(self, channel: str, text: str, msg_blocks: list[dict[str, Any]],
                   thread_ts: str | None = None) -> tuple[str, str]:  # fmt: skip
        """Post a message (a reply when thread_ts): its (channel id, ts)."""
        args: dict[str, Any] = {"channel": channel, "text": text}
        if msg_blocks:  # a reply is text alone
            args["blocks"] = msg_blocks
        if thread_ts is not None:
            args["thread_ts"] = thread_ts
        answer = await self.call("chat.postMessage", **args)
        return str(answer.get("channel") or channel), str(answer.get("ts"))

    async def update(
        self, channel_id: str, ts: str, text: str, msg_blocks: list[dict[str, Any]]
    ) -> None:
        await self.call("chat.update", channel=channel_id, ts=ts, text=text, blocks=msg_blocks)


class SlackChannel:
    """Sends slack-app:// notifiers' rows (see the module's docstring)."""

    name = NAME

    def __init__(
        self,
        store: Store,
        rules: Callable[[], Any],
        *,
        schedule: Schedule,
        messenger: Messenger,
        public_url: str | None,
        link_ttl: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.rules = rules
        self.schedule = schedule
        self.messenger = messenger
        self.public_url = public_url
        self.link_ttl = link_ttl
        self.clock = clock
        self._links: Links | None = None
        self._links_lock = asyncio.Lock()

    async def lanes(self) -> list[tuple[str, int]]:
        return apprise.lanes_of(self.rules(), self.name)

    def describe(self, row: OutboxRow) -> str:
        return f"{row.label} Slack message for event {row.event_id} (rule {row.rule})"

    async def links(self) -> Links:
        """The action links' signer: the buttons carry its tokens even without
        RECEIVER_PUBLIC_URL (which only the Open button needs)."""
        from receiver.links import load as load_links

        async with self._links_lock:
            if self._links is None:
                self._links = await load_links(
                    self.store, base=self.public_url or "", ttl=self.link_ttl, clock=self.clock
                )
            return self._links

    async def send(self, row: OutboxRow) -> Result:
        from receiver.notify.episodes import episode_of

        try:
            target = self._target(row)
            links = await self.links()
            episode = await episode_of(self.store, row, links)
            if episode is None:
                text, msg_blocks = blocks.plain(row.title, row.body)
                await self.messenger.post(target.channel, text, msg_blocks)
                return Result.delivered(status=200)
            return await self._episode(row, target, episode, links)
        except SendError as exc:
            return Result.retry(str(exc), retry_after=exc.retry_after)

    async def _episode(
        self, row: OutboxRow, target: SlackURL, episode: Episode, links: Links
    ) -> Result:
        now = self.clock()
        claim = await self.store.threads.claim(episode.key, target.key, now=now, lease=CLAIM_LEASE)
        if claim.state == "busy":
            return Result.retry(
                "slack: the episode's first message is being posted by another sender",
                retry_after=BUSY_RETRY,
            )
        if claim.state == "mine":
            card = blocks.new_card(
                title=row.title,
                body=row.body,
                alert=episode.alert,
                episode=episode.episode,
                rule=row.rule,
                buttons=target.buttons,
            )
            card = await state_of(self.store, card, episode)
            text, msg_blocks = rendered(card, links, episode, self.public_url)
            try:
                channel_id, ts = await self.messenger.post(target.channel, text, msg_blocks)
            except SendError:
                await self.store.threads.release(episode.key, target.key)
                raise
            await self.store.threads.posted(
                episode.key, target.key, channel_id=channel_id, ts=ts, card=card, now=now
            )
            return Result.delivered(status=200)
        thread = claim.thread
        assert thread.channel_id is not None and thread.ts is not None
        card = await state_of(self.store, thread.card, episode)
        text, msg_blocks = rendered(card, links, episode, self.public_url)
        channel_id, ts = thread.channel_id, thread.ts
        try:
            await self.messenger.update(channel_id, ts, text, msg_blocks)
            await self.store.threads.update(episode.key, target.key, card=card, now=now)
        except SendError as exc:
            if exc.error != "message_not_found":
                raise
            # Someone deleted the message in Slack: the episode gets a new one.
            channel_id, ts = await self.messenger.post(target.channel, text, msg_blocks)
            await self.store.threads.moved(
                episode.key, target.key, channel_id=channel_id, ts=ts, card=card, now=now
            )
        reply = blocks.reply(row.title, row.body)
        await self.messenger.post(channel_id, reply, [], thread_ts=ts)
        return Result.delivered(status=200)

    def _target(self, row: OutboxRow) -> SlackURL:
        notifier = self.rules().notifiers.get(row.notifier)
        if notifier is None or row.target >= len(notifier.urls):
            raise SendError("target", f'notifier "{row.notifier}" no longer sends there')
        found = parse(str(notifier.urls[row.target]))
        if isinstance(found, str):
            raise SendError("target", found)
        return found


async def state_of(
    store: Store, card: dict[str, Any], episode: Episode, note: str | None = None
) -> dict[str, Any]:
    """card as episode stands now (resolved: by whom, when an operator did it)."""
    resolved_by = None
    if episode.state == "resolved":
        done = [
            a.actor
            for a in await store.alerts.actions([episode.alert])
            if (a.episode, a.action, a.outcome) == (episode.episode, "resolve", "done")
        ]
        resolved_by = done[-1] if done else None
    return blocks.with_state(
        card,
        state=episode.state,
        acked_by=episode.acked_by,
        acked_at=episode.acked_at,
        snoozed_until=episode.snoozed_until,
        resolved_by=resolved_by,
        note=note,
    )


def rendered(
    card: dict[str, Any], links: Links, episode: Episode, public_url: str | None
) -> tuple[str, list[dict[str, Any]]]:
    """The message of card, its buttons signed for episode."""
    tokens = {a: links.token(episode.alert, a, episode.episode) for a in blocks.BUTTONS}
    link = links.alert_page(episode.alert) if public_url else None
    return blocks.render(card, tokens=tokens, link=link)
