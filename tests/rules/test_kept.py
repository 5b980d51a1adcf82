"""The rules file routing keeps for explain (receiver/rules/kept.py): no notifier url in it,
and loaded leniently it decides as the original does."""

from __future__ import annotations

from receiver.rules import load_text
from receiver.rules.kept import REDACTED, shareable

TEXT = """\
notifiers:
  oncall: "json://user:s3cret@hooks.example/oncall"
  team: ["json://hooks.example/a?token=t0k", "json://hooks.example/b"]
rules:
  - name: drops
    match: {type: score.drop}
    notify: [oncall, team]
"""


def test_every_notifier_url_is_replaced_and_nothing_else() -> None:
    kept = shareable(TEXT)
    assert "s3cret" not in kept and "t0k" not in kept and "hooks.example" not in kept
    assert kept.count(REDACTED) == 3
    original = load_text(TEXT, {})
    loaded = load_text(kept, {}, lenient_env=True)
    assert [r.name for r in loaded.rules] == [r.name for r in original.rules]
    assert [r.notify for r in loaded.rules] == [r.notify for r in original.rules]


def test_a_file_without_notifiers_is_kept_as_it_is() -> None:
    text = "rules: []\n"
    assert shareable(text) == text
