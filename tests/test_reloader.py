"""The rules in force and their reloads (receiver.reloader): a reload that follows a refused
one says the rules recovered."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from receiver import rules
from receiver.metrics import Metrics
from receiver.reloader import RulesHolder


def test_a_reload_that_succeeds_after_a_refused_one_says_it_recovered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "rules.yaml"
    good = "rules:\n  - name: all\n    notify: console\n"
    path.write_text(good)
    holder, metrics = RulesHolder(path, rules.load_file(path)), Metrics()
    path.write_text("rules: [")
    with caplog.at_level(logging.INFO, logger="receiver"):
        assert holder.reload(metrics) is False
        path.write_text(good)  # back to the very rules in force
        assert holder.reload(metrics) is True
    assert "rules reload refused" in caplog.text
    assert f"rules reload recovered: {path} is valid again, 1 rule in force" in caplog.text
    assert holder.status()["last_reload"] == "ok"
