"""Shrinking a failing scenario: delta debugging (ddmin) over its operations, then over
its rules files (whole rules, then keys of a rule, match conditions, top-level sections),
keeping each cut that still breaks the same invariant. A cut the loader refuses is not
kept. What is left is written as files a developer replays (python -m tests.sim --replay).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from receiver.errors import ConfigError
from tests.sim.generate import Op, Scenario, check

Fails = Callable[[Scenario], bool]
MAX_RUNS = 400  # a bound on the runs one shrink may take


class _Budget:
    def __init__(self, fails: Fails) -> None:
        self.fails = fails
        self.runs = 0

    def __call__(self, candidate: Scenario) -> bool:
        if self.runs >= MAX_RUNS:
            return False
        self.runs += 1
        return self.fails(candidate)


def _with_ops(s: Scenario, ops: list[Op]) -> Scenario:
    return dataclasses.replace(s, ops=ops)


def _ddmin_ops(s: Scenario, fails: Fails) -> Scenario:
    ops = list(s.ops)
    n = 2
    while len(ops) >= 2:
        chunk = max(1, len(ops) // n)
        cut = False
        for start in range(0, len(ops), chunk):
            rest = ops[:start] + ops[start + chunk :]
            if rest and fails(_with_ops(s, rest)):
                ops, n, cut = rest, max(n - 1, 2), True
                break
        if not cut:
            if chunk == 1:
                break
            n = min(len(ops), n * 2)
    return _with_ops(s, ops)


def _cuts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Smaller versions of one rules file, one cut each."""
    out = []
    rules = doc.get("rules") or []
    for i in range(len(rules)):
        if len(rules) > 1:
            smaller = copy.deepcopy(doc)
            del smaller["rules"][i]
            out.append(smaller)
        for key in list(rules[i]):
            if key == "name":
                continue
            smaller = copy.deepcopy(doc)
            del smaller["rules"][i][key]
            out.append(smaller)
        for field in list(rules[i].get("match") or {}):
            smaller = copy.deepcopy(doc)
            del smaller["rules"][i]["match"][field]
            out.append(smaller)
    for key in ("inhibit", "heartbeat", "schedules", "escalations"):
        if key in doc:
            smaller = copy.deepcopy(doc)
            del smaller[key]
            out.append(smaller)
    for name, policy in (doc.get("escalations") or {}).items():
        for key in ("repeat", "reack"):
            if key in policy:
                smaller = copy.deepcopy(doc)
                del smaller["escalations"][name][key]
                out.append(smaller)
        if len(policy["steps"]) > 1:
            smaller = copy.deepcopy(doc)
            smaller["escalations"][name]["steps"].pop()
            smaller["escalations"][name].pop("repeat", None)
            out.append(smaller)
    return out


def _shrink_rules(s: Scenario, fails: Fails) -> Scenario:
    texts = list(s.rules)
    for index in range(len(texts)):
        progress = True
        while progress:
            progress = False
            for smaller in _cuts(yaml.safe_load(texts[index])):
                text = yaml.safe_dump(smaller, sort_keys=False)
                try:
                    check(text)
                except ConfigError:
                    continue
                candidate = texts[:index] + [text] + texts[index + 1 :]
                if fails(dataclasses.replace(s, rules=candidate)):
                    texts, progress = candidate, True
                    break
    return dataclasses.replace(s, rules=texts)


def shrink(s: Scenario, fails: Fails) -> Scenario:
    """The smallest scenario found that still fails (fails(s) must hold)."""
    budget = _Budget(fails)
    s = _ddmin_ops(s, budget)
    s = _one_file(s, budget)
    s = _shrink_rules(s, budget)
    return _ddmin_ops(s, budget)  # rules cut may let more operations go


def _one_file(s: Scenario, fails: Fails) -> Scenario:
    """The first rules file alone, when the failure needs no reload (the others are then
    not written)."""
    reloads = [o for o in s.ops if o.kind == "reload"]
    if len(s.rules) == 1:
        return s
    if not reloads:
        return dataclasses.replace(s, rules=s.rules[:1])
    alone = dataclasses.replace(s, rules=s.rules[:1], ops=[o for o in s.ops if o.kind != "reload"])
    return alone if fails(alone) else s


def write(s: Scenario, out: Path, invariant: str, detail: str) -> list[Path]:
    """The minimized case as files: the rules file(s), the stream, and the whole scenario."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, text in enumerate(s.rules):
        path = out / f"seed-{s.seed}.rules{'' if i == 0 else f'.{i}'}.yaml"
        path.write_text(text)
        paths.append(path)
    stream = out / f"seed-{s.seed}.stream.jsonl"
    stream.write_text(
        "".join(json.dumps({"at": o.at, "kind": o.kind, **o.data}) + "\n" for o in s.ops)
    )
    whole = out / f"seed-{s.seed}.json"
    whole.write_text(json.dumps({"invariant": invariant, "detail": detail, **s.dump()}, indent=1))
    return [*paths, stream, whole]
