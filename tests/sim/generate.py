"""Random but valid rules files and event streams, drawn from one seed (random.Random).

A scenario is a list of rules files (the first in force at the start, the others loaded
by `reload` operations) and a list of operations on a virtual clock: events delivered,
silences added and expired, acks, resolves and snoozes, crashes. Every rules file is
checked with the receiver's own loader (receiver.rules.load_text, what `receiver check`
runs): a file it refuses is a bug of this generator, except a pair of rule keys the
loader refuses on purpose (storm with group, group with escalate, and any pair it names
in its message): the generator expects that refusal, records it, and drops the key.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

import yaml

from receiver.errors import ConfigError
from receiver.rules import Ruleset, load_text
from receiver.rules.options import check_pairs
from tests.sim import subscribers

DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

NOTIFIERS = ("chat", "mail", "pager")
SESSIONS = ("s1", "s2", "s3", "s4", "s5")
USERS = ("u1", "u2", "u3")
CONTEXTS = ("checkout", "home", "search")
TYPES = ("score.drop", "score.recover", "session.stopped", "intervention.fired",
         "intervention.resolved")  # fmt: skip
LIFECYCLE = ("hold", "resolve", "repeat", "escalate", "group", "throttle", "storm", "active")
T0 = 1_796_025_600.0  # 2026-12-01T00:00:00Z, a Tuesday: every seed starts here (plus a draw)


class GeneratorBug(AssertionError):
    """The loader refused a file this generator meant to be valid."""


@dataclass
class Op:
    """One operation at virtual time `at` (seconds after the scenario's start)."""

    at: float
    kind: str  # event | silence | unsilence | reload | ack | resolve | snooze | crash | tick
    # | redeliver | enable
    data: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"{self.at:.3f} {self.kind} {json.dumps(self.data, sort_keys=True)}"


@dataclass
class Scenario:
    seed: int
    start: float
    rules: list[str]  # YAML texts; rules[0] at the start, reload ops name an index
    ops: list[Op]
    refused: list[str] = field(default_factory=list)  # pair refusals the loader gave
    fails: float = 0.0  # the share of sends that fail (tests.sim.sends); 0: none do
    # Webhook subscribers, their outages, and when a failing one is disabled (seconds):
    # tests.sim.subscribers. None in a scenario cut for another store or a backtest.
    subscribers: list[dict[str, Any]] = field(default_factory=list)
    disable_after: float = 0.0

    def dump(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "start": self.start,
            "rules": self.rules,
            "fails": self.fails,
            "subscribers": self.subscribers,
            "disable_after": self.disable_after,
            "ops": [{"at": o.at, "kind": o.kind, **o.data} for o in self.ops],
        }

    @staticmethod
    def load(raw: dict[str, Any]) -> Scenario:
        ops = []
        for o in raw["ops"]:
            data = {k: v for k, v in o.items() if k not in ("at", "kind")}
            ops.append(Op(float(o["at"]), str(o["kind"]), data))
        return Scenario(
            int(raw["seed"]), float(raw["start"]), list(raw["rules"]), ops,
            fails=float(raw.get("fails", 0.0)), subscribers=list(raw.get("subscribers", [])),
            disable_after=float(raw.get("disable_after", 0.0)),
        )  # fmt: skip


_LOADED: dict[str, Ruleset] = {}  # the last files loaded, by text (a Ruleset is immutable)


def check(text: str) -> Ruleset:
    """The receiver's own loader on a generated file (no environment needed); a file
    loaded again (the runner, a shrink's replays) is not compiled twice."""
    found = _LOADED.get(text)
    if found is None:
        found = load_text(text, {}, source="sim.yaml")
        if len(_LOADED) > 256:
            _LOADED.clear()
        _LOADED[text] = found
    return found


# -- rules ------------------------------------------------------------------------------------


def _duration(r: random.Random, lo: int, hi: int) -> str:
    seconds = r.randint(lo, hi)
    if seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def _matcher(r: random.Random) -> dict[str, Any]:
    """A `match` mapping using every matcher form: exact, glob, regex, number, operators,
    list, dotted path, boolean."""
    match: dict[str, Any] = {}
    kind = r.choice(["exact", "glob", "list", "regex", "none"])
    if kind == "exact":
        match["type"] = r.choice(TYPES)
    elif kind == "glob":
        match["type"] = r.choice(["score.*", "intervention.*", "*.drop", "s*"])
    elif kind == "list":
        match["type"] = r.sample(list(TYPES), r.randint(1, 3))
    elif kind == "regex":
        match["type"] = r.choice(["~^score", "~drop$", "~(?i)INTERVENTION"])
    extra = r.random()
    if extra < 0.15:
        match["score"] = r.choice([{"lt": 30}, {"gte": 10, "lt": 50}, {"between": [0, 25]}, 22])
    elif extra < 0.25:
        match["userId"] = r.choice([r.choice(USERS), list(r.sample(USERS, 2)), "~^u[12]"])
    elif extra < 0.32:
        match["meta.context"] = r.choice(CONTEXTS)
    elif extra < 0.36:
        match["flagged"] = r.choice([True, False])
    return match


def _policy(r: random.Random) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    for i in range(r.randint(1, 3)):
        step: dict[str, Any] = {"notify": r.sample(_targets(r), 1)}
        if i > 0 or r.random() < 0.3:
            step["after"] = _duration(r, 30, 600)
        steps.append(step)
    policy: dict[str, Any] = {"steps": steps}
    if r.random() < 0.4:
        if "after" not in steps[-1]:
            steps[-1]["after"] = _duration(r, 30, 600)
        policy["repeat"] = r.randint(1, 3)
    if r.random() < 0.3:
        policy["reack"] = _duration(r, 120, 1800)
    return policy


_SCHEDULED = [False]  # whether the file being drawn has a schedule (set by _rules_file)


def _targets(r: random.Random) -> list[str]:
    return list(NOTIFIERS) + (["schedule:oncall"] if _SCHEDULED[0] else [])


def _active(r: random.Random) -> dict[str, Any]:
    start = r.randint(0, 23)
    end = (start + r.randint(1, 23)) % 24
    window: dict[str, Any] = {"hours": f"{start:02d}:00-{end:02d}:00"}
    if r.random() < 0.4:
        window["days"] = r.sample(["mon", "tue", "wed", "thu", "fri", "sat", "sun"], 4)
    if r.random() < 0.3:
        window["tz"] = r.choice(["Europe/Berlin", "America/New_York", "UTC"])
    if r.random() < 0.4:
        window["defer"] = True
    return window


def _rule(r: random.Random, name: str, policies: list[str]) -> dict[str, Any]:
    rule: dict[str, Any] = {"name": name}
    match = _matcher(r)
    if match or r.random() < 0.7:
        rule["match"] = match
    escalate = policies and r.random() < 0.45
    if escalate:
        rule["escalate"] = r.choice(policies)
    if not escalate or r.random() < 0.35:
        rule["notify"] = r.sample(_targets(r), r.randint(1, 2))
    keys = [k for k in LIFECYCLE if k != "escalate"]
    for key in r.sample(keys, r.choice([0, 1, 1, 2, 2, 3])):
        if key == "hold":
            rule["hold"] = _duration(r, 10, 300)
        elif key == "resolve":
            rule["resolve"] = True
        elif key == "repeat":
            rule["repeat"] = _duration(r, 300, 3600)
        elif key == "group":
            group: dict[str, Any] = {"wait": _duration(r, 10, 120)}
            if r.random() < 0.6:
                group["by"] = r.sample(["type", "sessionId", "userId"], r.randint(1, 2))
            if r.random() < 0.4:
                group["max"] = r.randint(2, 6)
            rule["group"] = group
        elif key == "throttle":
            throttle: dict[str, Any] = {"every": _duration(r, 30, 900)}
            if r.random() < 0.6:
                throttle["key"] = r.choice(["{{ sessionId }}", "{{ userId }}"])
            rule["throttle"] = throttle
        elif key == "storm":
            rule["storm"] = {"max": r.randint(1, 3), "per": _duration(r, 30, 300)}
        elif key == "active":
            rule["active"] = _active(r)
    if r.random() < 0.3:
        rule["continue"] = True
    _flap(r, rule)
    return rule


def _flap(parent: random.Random, rule: dict[str, Any]) -> None:
    """Flap detection on some rules (`flap:`): few changes in a wide window and a short
    quiet, so the streams' drops and recovers of five sessions make alerts flap and settle
    (open and resolved) inside a scenario. A pair the loader refuses is dropped, as any.
    Drawn from a generator of its own, seeded from the parent's state without advancing
    it, so every other draw of a seed (its rules and stream) stays what it was."""
    r = random.Random(f"flap {rule['name']} {parent.getstate()[1][:8]}")
    if r.random() < 0.25:
        rule["flap"] = {
            "changes": r.randint(2, 4),
            "within": _duration(r, 300, 3600),
            "quiet": _duration(r, 60, 1200),
        }


def _rules_file(r: random.Random) -> dict[str, Any]:
    _SCHEDULED[0] = r.random() < 0.3
    doc: dict[str, Any] = {"notifiers": {n: f"json://127.0.0.1:9/{n}" for n in NOTIFIERS}}
    doc["notifiers"]["pager"] = "ntfys://127.0.0.1:9/pager"  # the ntfy channel's
    if r.random() < 0.3:  # the Slack app's channel (the runner sends no row, any channel)
        doc["notifiers"]["chat"] = f"slack-app://C0SIM{r.choice(['', '?buttons=ack'])}"
    if _SCHEDULED[0]:
        schedule: dict[str, Any] = {
            "timezone": r.choice(["UTC", "Europe/Berlin"]),
            "rotation": r.choice(["daily", "weekly", "12h"]),
            "start": "2026-11-30",
            "members": r.sample(list(NOTIFIERS), 2),
        }
        schedule["handoff"] = "Mon 09:00" if schedule["rotation"] == "weekly" else "09:00"
        if r.random() < 0.5:
            schedule["overrides"] = [
                {"from": "2026-12-01T02:00", "to": "2026-12-01T05:00", "member": "pager"}
            ]
        doc["schedules"] = {"oncall": schedule}
    policies = [f"p{i}" for i in range(r.randint(0, 2))]
    if policies:
        doc["escalations"] = {name: _policy(r) for name in policies}
    doc["rules"] = [_rule(r, f"r{i}", policies) for i in range(r.randint(1, 4))]
    if r.random() < 0.25:
        doc["inhibit"] = [
            {
                "name": "iv-covers-drop",
                "source": {"type": "intervention.fired"},
                "target": {"type": "score.drop"},
                "equal": ["sessionId"],
            }
        ]
    if r.random() < 0.1:
        doc["heartbeat"] = {"silent_for": _duration(r, 600, 3600), "notify": ["pager"]}
    _maintenance(r, doc)
    return doc


def _maintenance(parent: random.Random, doc: dict[str, Any]) -> None:
    """Maintenance windows in some files: the same hours every day (a scenario runs for
    hours, so its stream crosses starts and ends), in one of three zones, for some sessions
    or all, some with notices; some files add the scenarios' week as one-off dates. Drawn
    from a generator of its own, seeded from the parent's state without advancing it, so
    every other draw of a seed stays what it was."""
    r = random.Random(f"maintenance {parent.getstate()[1][:8]}")
    if r.random() >= 0.3:
        return
    windows = []
    for i in range(r.randint(1, 2)):
        start, hours = r.randint(0, 23), r.randint(1, 4)
        end = (start + hours) % 24
        days = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
        window: dict[str, Any] = {
            "name": f"m{i}",
            "timezone": r.choice(["UTC", "Europe/Berlin", "America/New_York"]),
            "every": [
                f"{day} {start:02d}:{r.choice(['00', '30'])}-{days[(n + 1) % 7] if end <= start else day}"  # noqa: E501
                f" {end:02d}:00"
                for n, day in enumerate(days)
            ],
        }
        if r.random() < 0.5:
            window["match"] = {"sessionId": r.sample(list(SESSIONS), 2)}
        if r.random() < 0.5:
            window["notify"] = ["pager"]
        if r.random() < 0.1:
            window["dates"] = ["2026-12-02..2026-12-02"]
        windows.append(window)
    doc["maintenance"] = windows


def rules_text(r: random.Random, refused: list[str]) -> str:
    """A rules file the loader accepts; a pair of keys it refuses is dropped (recorded)."""
    doc = _rules_file(r)
    for _ in range(20):
        text = yaml.dump(doc, Dumper=DUMPER, sort_keys=False)
        try:
            check(text)
            return text
        except ConfigError as exc:
            message = str(exc)
            if not _drop_refused_pair(doc, message):
                raise GeneratorBug(
                    f"the loader refused a generated file: {message}\n{text}"
                ) from exc
            refused.append(message)
    raise GeneratorBug("a generated file kept being refused")


def _drop_refused_pair(doc: dict[str, Any], message: str) -> bool:
    """A refusal of a pair of a rule's keys (receiver.rules.options.check_pairs, the table
    `receiver check` refuses from): drop the key it names, the pair's second."""
    for rule in doc["rules"]:
        label = f'rule "{rule["name"]}"'
        if label not in message:
            continue
        problems: list[str] = []
        check_pairs(rule, label, problems)
        for problem in problems:
            key = problem.removeprefix(f"{label}: ").split(":", 1)[0]
            if problem in message and key in rule:
                del rule[key]
                if "notify" not in rule and "escalate" not in rule:
                    rule["notify"] = ["chat"]
                return True
    return False


# -- streams ----------------------------------------------------------------------------------


def _event(r: random.Random, n: int, at: float, start: float, skew: float) -> dict[str, Any]:
    kind = r.choices(TYPES, weights=[5, 3, 1, 2, 1])[0]
    session = r.choice(SESSIONS)
    body: dict[str, Any] = {
        "id": f"evt_{n}",
        "type": kind,
        "sessionId": session,
        "timestamp": _iso(start + at + skew),
    }
    if kind.startswith("score."):
        body["userId"] = USERS[SESSIONS.index(session) % len(USERS)]
        body["score"] = r.choice([5, 15, 22, 35]) if kind == "score.drop" else 61
        body["threshold"] = 40
    elif r.random() < 0.7:
        body["userId"] = USERS[SESSIONS.index(session) % len(USERS)]
    if kind.startswith("intervention."):
        body["interventionId"] = r.choice(["iv1", "iv2"])
    if r.random() < 0.3:
        body["meta"] = {"context": r.choice(CONTEXTS)}
    if r.random() < 0.1:
        body["flagged"] = r.random() < 0.5
    return body


def _iso(ts: float) -> str:
    from receiver.events import iso_epoch

    return iso_epoch(ts, digits=3)


def stream(r: random.Random, start: float, files: int) -> list[Op]:
    """Operations in time order: events (duplicates, conflicting duplicates, late ones,
    bursts, idle gaps, clock jumps of the sender), silences, reloads, actions, crashes."""
    ops: list[Op] = []
    at, n, skew = 0.0, 0, 0.0
    sent: list[dict[str, Any]] = []
    for _ in range(r.randint(15, 45)):
        roll = r.random()
        if roll < 0.06:
            at += r.choice([1800.0, 3600.0, 5400.0])  # idle gap (the heartbeat's)
        elif roll < 0.09:
            skew += r.choice([-600.0, 300.0, 3600.0])  # the sender's clock jumps
        at += r.choice([0.0, 0.5, 2.0, 10.0, 30.0, 60.0, 120.0, 300.0])
        roll = r.random()
        if roll < 0.62 or not sent:
            for _ in range(r.choice([1, 1, 1, 2, 4])):  # a burst now and then
                n += 1
                late = -r.choice([5.0, 60.0, 600.0]) if r.random() < 0.1 else 0.0
                body = _event(r, n, at, start, skew + late)
                sent.append(body)
                ops.append(Op(at, "event", {"body": body}))
        elif roll < 0.68:
            ops.append(Op(at, "event", {"body": r.choice(sent)}))  # duplicate
        elif roll < 0.71:
            body = dict(r.choice(sent))
            body["score"] = 99  # a conflicting duplicate: same id, other body
            ops.append(Op(at, "event", {"body": body}))
        elif roll < 0.76:
            matchers = r.choice([{"sessionId": r.choice(SESSIONS)}, {"type": "score.drop"},
                                 {"userId": r.choice(USERS)}])  # fmt: skip
            ops.append(Op(at, "silence", {"match": matchers, "for": r.choice([60, 600, 3600])}))
        elif roll < 0.79:
            ops.append(Op(at, "unsilence", {"nth": r.randint(0, 3)}))
        elif roll < 0.82 and files > 1:
            ops.append(Op(at, "reload", {"file": r.randrange(files)}))
        elif roll < 0.92:
            action = r.choice(["ack", "ack", "resolve", "snooze"])
            data: dict[str, Any] = {"alert": f"session:{r.choice(SESSIONS)}"}
            if action == "snooze":
                data["seconds"] = r.choice([60, 600])
            ops.append(Op(at, action, data))
        else:
            ops.append(Op(at, "crash", {"where": r.choice(["between", "in-tx", "in-send"])}))
    ops.append(Op(at + 7200.0, "tick", {}))  # let every timer run out at the end
    return ops


def vary_silences(seed: int, ops: list[Op]) -> None:
    """Some silences match a field that differs between the events of one alert (its
    context, a flag), so an update can be silenced while its alert's opener is not: what
    a chain or a woken notification is judged by then shows. Drawn from a stream of its
    own, so the seed's other draws stay as they were."""
    r = random.Random(f"silences:{seed}")
    for op in ops:
        if op.kind == "silence" and r.random() < 0.35:
            op.data["match"] = r.choice(
                [{"meta.context": r.choice(CONTEXTS)}, {"flagged": r.choice([True, False])}]
            )


def action_fronts(seed: int, ops: list[Op]) -> None:
    """The front end each ack, resolve and snooze comes through (tests.sim.fronts): the
    engine, a one-click link (now and then one of an episode that is over), the API or the
    CLI. Drawn from a stream of its own, so the seed's other draws stay as they were."""
    r = random.Random(f"fronts:{seed}")
    for op in ops:
        if op.kind in ("ack", "resolve", "snooze"):
            op.data["via"] = r.choice(["engine", "link", "api", "cli"])
            if op.data["via"] == "link" and r.random() < 0.2:
                op.data["stale"] = True


def failing_sends(seed: int, ops: list[Op]) -> float:
    """Whether (and how often) the seed's sends fail, a retry or a give-up
    (tests.sim.sends), and operator retries of what went dead ("redeliver", `receiver
    deliveries retry`) put among the operations. Drawn from a stream of its own."""
    r = random.Random(f"sends:{seed}")
    if r.random() < 0.5:
        return 0.0
    for _ in range(r.randint(0, 2)):
        after = r.randrange(len(ops) - 1)  # never after the last step (every timer's end)
        ops.insert(after + 1, Op(ops[after].at, "redeliver", {}))
    return r.choice([0.1, 0.2, 0.4])


def scenario(seed: int) -> Scenario:
    r = random.Random(seed)
    refused: list[str] = []
    files = [rules_text(r, refused) for _ in range(r.choice([1, 1, 2, 3]))]
    start = T0 + r.randint(0, 7 * 24) * 3600.0 + r.randint(0, 59) * 60.0
    ops = stream(r, start, len(files))
    _until_resolved(seed, ops)
    vary_silences(seed, ops)
    action_fronts(seed, ops)
    fails = failing_sends(seed, ops)
    hooks, disable_after = subscribers.draw(seed, ops, files)
    return Scenario(seed, start, files, ops, refused, fails, hooks, disable_after)


def _until_resolved(seed: int, ops: list[Op]) -> None:
    """Some silences end with their alerts (`--until-resolved --after N`): drawn from a
    generator of their own, so every other draw of the seed stays what it was."""
    r = random.Random(f"until-resolved {seed}")
    for op in ops:
        if op.kind == "silence" and r.random() < 0.4:
            op.data["after"] = float(r.choice([60, 300, 900]))
