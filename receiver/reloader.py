"""The rules in force and their reloads: the file read at start (or the built-in rules), a new
file swapped in whole on SIGHUP or when the watcher sees it change, a bad one refused."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from receiver import rules
from receiver.errors import ConfigError
from receiver.metrics import Metrics
from receiver.settings import Settings
from receiver.supervisor import Health

# The name the app logged these lines under before they moved here; log filters rely on it.
log = logging.getLogger("receiver")

# The rules watcher's longest wait for a change before it says it is alive.
WATCH_TIMEOUT_MS = 5000


@dataclass
class RulesHolder:
    """The rules in force, swapped whole on a successful reload.

    On the built-in rules (builtin=True), path is ./rules.yaml, not there yet:
    once it appears (`receiver init`), a reload (SIGHUP, or the watcher) adopts it.
    """

    path: Path
    current: rules.Ruleset
    loaded_at: float = field(default_factory=time.time)
    last_error: str | None = None
    builtin: bool = False

    def __call__(self) -> rules.Ruleset:
        return self.current

    def reload(self, metrics: Metrics) -> bool:
        if self.builtin and not self.path.exists():
            log.info("no %s; keeping the built-in rules", self.path)
            return False
        try:
            fresh = rules.load_file(self.path)
        except ConfigError as exc:
            self.last_error = str(exc)
            metrics.reloads["error"].inc()
            metrics.rules_ok.set(0)
            log.error("rules reload refused, keeping the previous rules: %s", exc)
            return False
        if self.builtin:
            log.info(
                "rules loaded from %s: %s, replacing the built-in rules",
                self.path,
                fresh.counted,
            )
        elif self.last_error is not None:
            # The refusal was logged as an error; say as plainly that it is over, even when
            # the file is back to the rules that kept running.
            log.info(
                "rules reload recovered: %s is valid again, %s in force (digest %s)",
                self.path,
                fresh.counted,
                fresh.digest,
            )
        elif fresh.digest != self.current.digest:
            log.info("rules reloaded from %s: %s", self.path, fresh.counted)
        self.current, self.loaded_at, self.last_error = fresh, time.time(), None
        self.builtin = False
        metrics.reloads["ok"].inc()
        metrics.rules_ok.set(1)
        return True

    def status(self) -> dict[str, Any]:
        return {
            "path": "built-in" if self.builtin else str(self.path),
            "rules": len(self.current.rules),
            "digest": self.current.digest,
            "loaded_at": self.loaded_at,
            "last_reload": "ok" if self.last_error is None else f"error: {self.last_error}",
        }


def initial_rules(settings: Settings) -> rules.Ruleset:
    """The rules file's rules, or the built-in ones when there is no file to read."""
    path = settings.rules_file
    if path is None:
        return rules.load_builtin()
    try:
        return rules.load_file(path)
    except ConfigError as exc:
        if path.exists():
            raise
        raise ConfigError(
            f"{exc.problems[0]}; RECEIVER_RULES (--rules) names this file: create it"
            f" (`receiver init {path}`), or unset RECEIVER_RULES to use ./rules.yaml or"
            " the built-in rules",
            source=exc.source,
        ) from exc


async def watch(holder: RulesHolder, metrics: Metrics, health: Health) -> None:
    """Reload the rules when their file changes (editors often replace it, so watch the
    folder). The watcher looks in every few seconds even when nothing changed, which is
    how the supervisor learns it works again after a failure."""
    from watchfiles import awatch

    target = holder.path.resolve()
    async for changes in awatch(
        target.parent, recursive=False, yield_on_timeout=True, rust_timeout=WATCH_TIMEOUT_MS
    ):
        if any(Path(path).resolve() == target for _, path in changes):
            holder.reload(metrics)
        health.ok()
