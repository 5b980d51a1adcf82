"""What both SQL stores say alike about chat threads (store.threads): the one message a chat
channel keeps per alert episode and target (the Slack app's), so later notifications of
the episode update it in place and reply in its thread instead of posting again.

A sender claims the (episode, target) row before it posts the first message, and records
the message's address after; another sender (another replica, another notifier naming the
same channel) that finds the claim held waits and tries again, so one episode never gets
two first messages. A claim is a lease: a sender that died holding it is taken over once
it ran out."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from receiver.store.statements import Query, Runner


@dataclass(frozen=True)
class ChatThread:
    """The one message a chat channel keeps for an alert episode at one target: key, the
    episode's; target, the notifier's channel as written (slack-app://C0123ABCD);
    channel_id and ts, the message's address once posted (None while a sender holds the
    claim to post it); card, what it shows (the channel's)."""

    key: str
    target: str
    channel_id: str | None
    ts: str | None
    card: dict[str, Any]
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class ThreadClaim:
    """claim's answer: "posted" (thread.ts is the message), "mine" (post it, then record
    it) or "busy" (another sender is posting it: try again shortly)."""

    state: str
    thread: ChatThread


THREADS_SCHEMA = """
    CREATE TABLE chat_threads (
        key TEXT NOT NULL,
        target TEXT NOT NULL,
        channel_id TEXT,
        ts TEXT,
        card TEXT,
        claimed_until {real},
        created_at {real} NOT NULL,
        updated_at {real} NOT NULL,
        PRIMARY KEY (key, target)
    );
    CREATE INDEX chat_threads_message ON chat_threads (channel_id, ts) WHERE ts IS NOT NULL
"""
_COLUMNS = "key, target, channel_id, ts, card, created_at, updated_at"


def _thread(row: Any) -> ChatThread:
    key, target, channel_id, ts, card, created_at, updated_at = row
    return ChatThread(
        key, target, channel_id, ts, json.loads(card) if card else {}, created_at, updated_at
    )


class SQLThreads:
    """store.threads (roles.Threads) on either SQL store."""

    def __init__(self, db: Runner) -> None:
        self.db = db

    async def claim(self, key: str, target: str, *, now: float, lease: float) -> ThreadClaim:
        """The message of (key, target) if it was posted ("posted"); else the right to post
        it until now + lease ("mine"), unless another sender holds that right ("busy")."""

        def claim(q: Query) -> ThreadClaim:
            made = q(
                "INSERT INTO chat_threads (key, target, claimed_until, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (key, target) DO NOTHING",
                (key, target, now + lease, now, now),
            ).rowcount
            row = q(
                f"SELECT {_COLUMNS}, claimed_until FROM chat_threads"
                f" WHERE key = ? AND target = ?{self.db.dialect.lock_key}",
                (key, target),
            ).fetchone()
            thread = _thread(row[:-1])
            if made == 1:
                return ThreadClaim("mine", thread)
            if thread.ts is not None:
                return ThreadClaim("posted", thread)
            if row[-1] is not None and row[-1] > now:
                return ThreadClaim("busy", thread)
            q(
                "UPDATE chat_threads SET claimed_until = ?, updated_at = ?"
                " WHERE key = ? AND target = ?",
                (now + lease, now, key, target),
            )
            return ThreadClaim("mine", thread)

        return await self.db.statements(claim)

    async def posted(
        self,
        key: str,
        target: str,
        *,
        channel_id: str,
        ts: str,
        card: dict[str, Any],
        now: float,
    ) -> bool:
        """Record the first message of (key, target), posted under a claim; False when
        one was recorded already (a claim taken over after it ran out)."""

        def write(q: Query) -> bool:
            return bool(
                q(
                    "UPDATE chat_threads SET channel_id = ?, ts = ?, card = ?,"
                    " claimed_until = NULL, updated_at = ?"
                    " WHERE key = ? AND target = ? AND ts IS NULL",
                    (channel_id, ts, json.dumps(card), now, key, target),
                ).rowcount
            )

        return await self.db.statements(write)

    async def moved(
        self, key: str, target: str, *, channel_id: str, ts: str, card: dict[str, Any], now: float
    ) -> None:
        """The message of (key, target) is now another (the first was deleted in Slack)."""

        def write(q: Query) -> None:
            q(
                "UPDATE chat_threads SET channel_id = ?, ts = ?, card = ?, updated_at = ?"
                " WHERE key = ? AND target = ?",
                (channel_id, ts, json.dumps(card), now, key, target),
            )

        await self.db.statements(write)

    async def release(self, key: str, target: str) -> None:
        """Give a claim back (the post failed): the next sender posts at once."""

        def write(q: Query) -> None:
            q(
                "DELETE FROM chat_threads WHERE key = ? AND target = ? AND ts IS NULL",
                (key, target),
            )

        await self.db.statements(write)

    async def update(self, key: str, target: str, *, card: dict[str, Any], now: float) -> None:
        """What the message of (key, target) shows now."""

        def write(q: Query) -> None:
            q(
                "UPDATE chat_threads SET card = ?, updated_at = ? WHERE key = ? AND target = ?",
                (json.dumps(card), now, key, target),
            )

        await self.db.statements(write)

    async def find(self, channel_id: str, ts: str) -> ChatThread | None:
        """The thread whose message is ts in channel_id (a click on it), or None."""

        def read(q: Query) -> ChatThread | None:
            row = q(
                f"SELECT {_COLUMNS} FROM chat_threads WHERE channel_id = ? AND ts = ?",
                (channel_id, ts),
            ).fetchone()
            return None if row is None else _thread(row)

        return await self.db.statements(read, write=False)
