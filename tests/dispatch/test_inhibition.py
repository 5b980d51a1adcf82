"""Inhibition end to end (the real server under uvicorn, on SQLite and on PostgreSQL, an HTTP
sink): while an intervention is open, the drops of its session (and team) are inhibited,
with the reason in their outbox rows, and nothing reaches the sink; a field missing on
either side inhibits nothing; a restart neither sends what was inhibited nor forgets the
source; a drop notified before its intervention still gets its resolved message; when the
intervention resolves, a drop still open is notified once ("was inhibited by ... since"),
and one that recovered meanwhile sends nothing.

Waits end as soon as a state holds. "Nothing was sent" is read from the outbox (the row is
`inhibited`, a state the notify worker never sends), then checked at the sink once the
timers have looked twice for what to wake (receiver_timer_passes_total{part="wake"}) and
the worker has sent all they queued (Scene.settled)."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from receiver.events import iso, sample
from tests.harness import Receiver, eventually
from tests.servers import HTTPSink

pytestmark = pytest.mark.e2e

RULE = "intervention-covers-drop"
RULES = """
notifiers:
  hook: "{url}"
rules:
  - name: intervention
    match: {{type: intervention.fired}}
    notify: hook
    title: "intervention {{{{ sessionId }}}}"
  - name: drop
    match: {{type: score.drop}}
    notify: hook
    resolve: true
    title: "drop {{{{ sessionId }}}}"
    resolved_title: "recovered {{{{ sessionId }}}}"
inhibit:
  - name: {rule}
    source: {{type: intervention.fired}}
    target: {{type: score.drop}}
    equal: [sessionId, team]
"""
WOKE = re.compile(rf"was inhibited by {RULE} since \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\dZ")
MISSING = object()  # a field the event does not have
FINAL = ("inhibited", "silenced", "muted", "cancelled", "dead", "stale", "throttled", "grouped")


class Scene:
    """A running receiver and its sink, with events stamped in the order they are sent."""

    def __init__(self, server: Receiver, sink: HTTPSink) -> None:
        self.server = server
        self.sink = sink
        self._last = datetime.now(UTC) - timedelta(seconds=30)
        self.stamps: dict[str, datetime] = {}  # event id -> its timestamp

    def send(
        self,
        kind: str,
        event_id: str,
        session: str,
        team: Any = MISSING,
        *,
        intervention: str | None = None,
    ) -> None:
        now = max(datetime.now(UTC), self._last + timedelta(milliseconds=1))
        self._last = self.stamps[event_id] = now
        fields: dict[str, Any] = {
            "id": event_id,
            "sessionId": session,
            "timestamp": iso(now, digits=3),
        }
        if kind.startswith("intervention."):
            fields["interventionId"] = intervention or f"i-{session}"
        if kind == "score.drop":
            fields["score"] = 5
        payload = sample(kind, **fields)
        if team is not MISSING:
            payload["team"] = team  # sample() drops a None; a null here is a JSON null
        answer = self.server.send(payload)
        assert answer.status_code == 202, answer.text

    def routed(self, *event_ids: str) -> None:
        """Wait until the router has routed these events (their rows are written)."""
        marks = ", ".join("?" for _ in event_ids)
        sql = f"SELECT count(*) FROM events WHERE routed_at IS NOT NULL AND id IN ({marks})"
        eventually(
            lambda: self.server.query(sql, event_ids)[0][0] == len(event_ids),
            f"{event_ids} to be routed",
        )

    def rows(self, event_id: str, rule: str = "drop") -> list[tuple[str, str | None, str]]:
        """(state, reason, kind) of the event's outbox rows of rule."""
        return [
            (state, reason, kind)
            for state, reason, kind in self.server.query(
                "SELECT state, reason, kind FROM outbox WHERE event_id = ? AND rule = ?"
                " ORDER BY id",
                (event_id, rule),
            )
        ]

    def delivered(self, event_id: str, kind: str = "event") -> None:
        """Wait until the event's notification of kind is delivered; fail at once if it
        is in a state it never leaves (inhibited, say)."""

        def done() -> bool:
            rows = self.rows(event_id)
            final = [r for r in rows if r[2] == kind and r[0] in FINAL]
            assert not final, f"{event_id}: {rows}, never to be delivered"
            return ("delivered", None, kind) in rows

        eventually(done, f"{event_id}'s {kind} notification to be delivered")

    def settled(self) -> None:
        """Wait until the timers have looked twice for what to wake (what they would send,
        they have queued) and the worker has sent everything queued (the sink has it).
        Idle, the timers run every IDLE_POLL (5 s); after a routing turn at once: an event
        no rule matches, sent now and then, brings the next look sooner."""
        wake = 'part="wake"'
        start = self.server.metric("receiver_timer_passes_total", wake)
        nudged = [0.0]

        def looked_twice() -> bool:
            if self.server.metric("receiver_timer_passes_total", wake) >= start + 2:
                return True
            if time.monotonic() - nudged[0] > 0.5:
                nudged[0] = time.monotonic()
                self.send("session.stopped", f"nudge-{uuid.uuid4().hex[:8]}", "nudge")
            return False

        eventually(looked_twice, "the timers to look twice for what to wake")
        eventually(
            lambda: (
                self.server.query(
                    "SELECT count(*) FROM outbox WHERE state IN ('pending', 'sending')"
                )[0][0]
                == 0
            ),
            "the worker to send what was queued",
        )

    def titles(self, title: str) -> list[dict[str, Any]]:
        return [r.json for r in self.sink.requests if r.json and r.json.get("title") == title]

    def reason(self, source_event: str) -> str:
        """The reason an inhibited row gives while source_event's alert is open."""
        since = self.stamps[source_event].strftime("%Y-%m-%d %H:%M:%SZ")
        return f"inhibited by {RULE} ({source_event}, open since {since})"


@pytest.fixture
def start(
    tmp_path: Path, http_sink: HTTPSink, receiver_db: str | None
) -> Iterator[Callable[[], Scene]]:
    """Starts the receiver with RULES on SQLite, and again on PostgreSQL (receiver_db)."""
    text = RULES.format(url=http_sink.json_url(), rule=RULE)

    def _start() -> Scene:
        return Scene(Receiver(tmp_path, rules=text, db=receiver_db).start(), http_sink)

    yield _start  # tests/conftest.py stops any server a failing test leaves behind


# Each case: the team of the source (an intervention) and of the target (a drop) of one
# session, and whether the drop is inhibited. equal is [sessionId, team]: both present and
# equal on both sides, or nothing is inhibited (two missing fields are not equal here).
MATRIX = [
    pytest.param("a", "a", True, id="present-and-equal"),
    pytest.param("a", "b", False, id="different-values"),
    pytest.param("a", MISSING, False, id="missing-on-the-target"),
    pytest.param(MISSING, "a", False, id="missing-on-the-source"),
    pytest.param(MISSING, MISSING, False, id="missing-on-both"),
    pytest.param(None, None, False, id="null-on-both"),
    pytest.param(1, "1", False, id="number-and-text"),
]


def test_the_source_target_equal_matrix(start: Callable[[], Scene]) -> None:
    """Every case of MATRIX on one server, each in a session of its own: the drop's row
    says inhibited with the reason, or it reaches the sink."""
    scene = start()
    cases = [(p.id, *p.values) for p in MATRIX]
    try:
        for n, (_, source, _, _) in enumerate(cases):
            scene.send("intervention.fired", f"src{n}", f"m{n}", team=source)
        # An intervention of another session, with a team every drop has: it covers none.
        scene.send("intervention.fired", "src-other", "m-other", team="a")
        scene.routed(*(f"src{n}" for n in range(len(cases))), "src-other")
        for n, (_, _, target, _) in enumerate(cases):
            scene.send("score.drop", f"drop{n}", f"m{n}", team=target)
        scene.routed(*(f"drop{n}" for n in range(len(cases))))

        wrong = []
        for n, (name, _, _, inhibited) in enumerate(cases):
            rows = scene.rows(f"drop{n}")
            if inhibited:
                expected = [("inhibited", scene.reason(f"src{n}"), "event")]
                if rows != expected:
                    wrong.append(f"{name}: {rows} != {expected}")
            else:
                try:
                    scene.delivered(f"drop{n}")
                except AssertionError:
                    wrong.append(f"{name}: {scene.rows(f'drop{n}')}, not delivered")
        scene.settled()
        for n, (name, _, _, inhibited) in enumerate(cases):
            got = len(scene.titles(f"drop m{n}"))
            if got != (0 if inhibited else 1):
                wrong.append(f"{name}: {got} messages at the sink")
            if len(scene.titles(f"intervention m{n}")) != 1:  # a source is never inhibited
                wrong.append(f"{name}: the intervention's message did not arrive once")
        assert not wrong, "\n".join(wrong)
        [(count,)] = scene.server.query("SELECT count(*) FROM outbox WHERE state = 'inhibited'")
        assert count == 1
    finally:
        scene.server.stop()


def test_a_drop_right_behind_its_intervention_is_inhibited(start: Callable[[], Scene]) -> None:
    """Sent back to back, most likely routed in one batch: the source is noted before the
    drop is placed. A drop ahead of its intervention is sent."""
    scene = start()
    try:
        scene.send("score.drop", "early", "s0", team="a")
        scene.send("intervention.fired", "src0", "s0", team="a")
        scene.send("intervention.fired", "src", "s1", team="a")
        scene.send("score.drop", "drop", "s1", team="a")
        scene.routed("early", "src0", "src", "drop")
        assert scene.rows("drop") == [("inhibited", scene.reason("src"), "event")]
        scene.delivered("early")
        scene.settled()
        assert scene.titles("drop s1") == [] and len(scene.titles("drop s0")) == 1
    finally:
        scene.server.stop()


def test_an_inhibition_outlives_a_restart(start: Callable[[], Scene]) -> None:
    """kill -9 with the intervention open and the drop inhibited: after the restart the
    drop is still not sent, nor is the next one, and the source is remembered."""
    scene = start()
    scene.send("intervention.fired", "src", "s1", team="a")
    scene.routed("src")
    scene.send("score.drop", "drop1", "s1", team="a")
    scene.routed("drop1")
    assert scene.rows("drop1") == [("inhibited", scene.reason("src"), "event")]
    assert len(scene.titles("intervention s1")) <= 1
    scene.server.kill()

    scene.server.start()
    try:
        scene.send("score.drop", "drop2", "s1", team="a")
        scene.routed("drop2")
        assert scene.rows("drop2") == [("inhibited", scene.reason("src"), "event")]
        scene.settled()  # the timers have looked at what waits, more than once
        assert scene.rows("drop1") == [("inhibited", scene.reason("src"), "event")]
        assert scene.titles("drop s1") == []
        [(alert, episode, event)] = scene.server.query(
            "SELECT alert, episode, event FROM inhibitors WHERE rule = ?", (RULE,)
        )
        assert (alert, episode, event) == ("intervention:s1:i-s1", 1, "src")
        [(sent,)] = scene.server.query(
            "SELECT count(*) FROM outbox WHERE rule = 'drop' AND state != 'inhibited'"
        )
        assert sent == 0
    finally:
        scene.server.stop()


def test_a_drop_notified_before_its_intervention_gets_its_resolved_message(
    start: Callable[[], Scene],
) -> None:
    scene = start()
    try:
        scene.send("score.drop", "drop1", "s1", team="a")
        scene.delivered("drop1")
        scene.send("intervention.fired", "src", "s1", team="a")
        scene.routed("src")
        scene.send("score.drop", "drop2", "s1", team="a")  # the same alert, now inhibited
        scene.routed("drop2")
        assert scene.rows("drop2") == [("inhibited", scene.reason("src"), "event")]
        scene.send("score.recover", "up", "s1", team="a")
        scene.routed("up")
        eventually(
            lambda: scene.rows("up") == [("delivered", None, "resolved")],
            "the resolved message to be delivered",
        )
        scene.settled()
        assert len(scene.titles("recovered s1")) == 1
        assert len(scene.titles("drop s1")) == 1  # the first drop; not the inhibited one
    finally:
        scene.server.stop()


def test_the_intervention_ending_notifies_a_drop_still_open_once(
    start: Callable[[], Scene],
) -> None:
    """s1's drop is still open when its intervention resolves: one message, "was inhibited
    by ... since", and its recovery then sends the resolved message; s2's drop recovered
    while inhibited: nothing, not even a resolved message (nothing was sent to answer);
    s3 has two interventions: its drop waits for the second to end too."""
    scene = start()
    try:
        for session in ("s1", "s2", "s3"):
            scene.send("intervention.fired", f"src-{session}", session, team="a")
        scene.send("intervention.fired", "src-s3b", "s3", team="a", intervention="second")
        scene.routed("src-s1", "src-s2", "src-s3", "src-s3b")
        for session in ("s1", "s2", "s3"):
            scene.send("score.drop", f"drop-{session}", session, team="a")
        scene.routed("drop-s1", "drop-s2", "drop-s3")
        for session in ("s1", "s2", "s3"):
            [(state, reason, _)] = scene.rows(f"drop-{session}")
            assert (state, reason) == ("inhibited", scene.reason(f"src-{session}"))
        scene.send("score.recover", "up-s2", "s2", team="a")
        scene.routed("up-s2")
        assert scene.rows("up-s2") == []  # no resolved message: nothing was sent

        scene.settled()  # still inhibited: the timers send nothing meanwhile
        assert not any(scene.titles(f"drop {s}") for s in ("s1", "s2", "s3"))
        for session in ("s1", "s2", "s3"):  # s3's first intervention; its second stays
            scene.send("intervention.resolved", f"end-{session}", session, team="a")
        scene.routed("end-s1", "end-s2", "end-s3")

        [woke] = eventually(lambda: scene.titles("drop s1"), "s1's drop to be notified")
        assert WOKE.search(woke["message"]), woke["message"]
        scene.settled()
        assert len(scene.titles("drop s1")) == 1
        assert scene.titles("drop s2") == [] and scene.titles("recovered s2") == []
        assert scene.titles("drop s3") == []  # still inhibited, by the second
        rows = scene.server.query(
            "SELECT state, kind FROM outbox WHERE alert = ? AND rule = 'drop' ORDER BY id",
            ("session:s1",),
        )
        assert rows == [("inhibited", "event"), ("delivered", "event")]
        [(s2_rows,)] = scene.server.query(
            "SELECT count(*) FROM outbox WHERE alert = 'session:s2' AND state != 'inhibited'"
        )
        assert s2_rows == 0
        assert scene.server.query("SELECT alert FROM inhibitors") == [("intervention:s3:second",)]

        # What was notified is answered: s1's recovery sends the resolved message.
        scene.send("score.recover", "up-s1", "s1", team="a")
        scene.routed("up-s1")
        scene.delivered("up-s1", kind="resolved")
        # s3's second intervention ends: now its drop is notified, once.
        scene.send("intervention.resolved", "end-s3b", "s3", team="a", intervention="second")
        [woke] = eventually(lambda: scene.titles("drop s3"), "s3's drop to be notified")
        assert WOKE.search(woke["message"]), woke["message"]
        scene.settled()
        assert len(scene.titles("drop s3")) == 1 and len(scene.titles("recovered s1")) == 1
        assert len(scene.titles("drop s1")) == 1
    finally:
        scene.server.stop()


def _resolve(scene: Scene, key: str, alert: str) -> None:
    answer = httpx.post(
        f"{scene.server.url}/v1/alerts/{alert}/resolve",
        headers={"Authorization": f"Bearer {key}"},
        timeout=15,
    )
    assert answer.status_code == 200 and answer.json()["result"] == "done", answer.text


def test_an_intervention_an_operator_resolved_inhibits_nothing(
    start: Callable[[], Scene],
) -> None:
    """Resolved from the API instead of by intervention.resolved: the drop that follows is
    sent, and one inhibited before it is notified once ("was inhibited by ... since")."""
    scene = start()
    try:
        key = scene.server.make_key("ops", role="writer")
        scene.send("intervention.fired", "src", "s1", team="a")
        scene.routed("src")
        scene.send("score.drop", "drop1", "s1", team="a")
        scene.routed("drop1")
        assert scene.rows("drop1") == [("inhibited", scene.reason("src"), "event")]
        _resolve(scene, key, "intervention:s1:i-s1")
        [woke] = eventually(lambda: scene.titles("drop s1"), "the inhibited drop to be notified")
        assert WOKE.search(woke["message"]), woke["message"]
        scene.send("score.drop", "drop2", "s2", team="a")  # another session, another alert
        scene.send("intervention.fired", "src2", "s2", team="b")  # another team
        scene.routed("drop2", "src2")
        scene.delivered("drop2")
        scene.settled()
        assert len(scene.titles("drop s1")) == 1
    finally:
        scene.server.stop()


def test_interventions_an_operator_resolved_do_not_hide_one_still_open(
    start: Callable[[], Scene],
) -> None:
    """Many interventions of one session resolved from the API (no intervention.resolved
    ever came), then one more fires: a drop of that session is inhibited by it. The
    resolved ones are older, and must not crowd the open one out of the look-up."""
    scene = start()
    try:
        key = scene.server.make_key("ops", role="writer")
        old = 10  # more than the look-up's page of sources (tx.inhibitors.find's limit, 8)
        for n in range(old):
            # Each its own alert: intervention:s1:i<n>.
            scene.send("intervention.fired", f"src{n}", "s1", team="a", intervention=f"i{n}")
        scene.routed(*(f"src{n}" for n in range(old)))
        for n in range(old):
            _resolve(scene, key, f"intervention:s1:i{n}")
        scene.send("intervention.fired", "src-open", "s1", team="a", intervention="i-open")
        scene.routed("src-open")
        scene.send("score.drop", "drop", "s1", team="a")
        scene.routed("drop")
        assert scene.rows("drop") == [("inhibited", scene.reason("src-open"), "event")]
        scene.settled()
        assert scene.titles("drop s1") == []
    finally:
        scene.server.stop()
