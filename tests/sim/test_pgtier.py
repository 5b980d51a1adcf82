"""The PostgreSQL tier of the simulation (`make sim PG=1`, tests.sim.pgtier) on the tests'
throwaway server: a seed keeps every invariant on PostgreSQL too, and the three stores
agree; a row PostgreSQL lacks is seen."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.pg import ThrowawayPostgres
from tests.sim import agree, pgtier
from tests.sim.__main__ import violation
from tests.sim.generate import scenario
from tests.sim.violation import Violation


@pytest.fixture
def tier(postgres: ThrowawayPostgres) -> Iterator[None]:
    pgtier.SERVER.append(postgres)
    yield
    pgtier.SERVER.remove(postgres)


@pytest.mark.parametrize("seed", [1, 34])  # 34 fails sends, retries them, gives some up
def test_a_seed_keeps_every_invariant_on_postgres_and_the_stores_agree(
    tier: None, seed: int
) -> None:
    assert violation(scenario(seed)) is None


def test_a_row_postgres_lacks_is_seen(tier: None, monkeypatch: pytest.MonkeyPatch) -> None:
    real = agree.final_state

    def lossy(run: object) -> tuple[list[object], list[object]]:
        rows, alerts = real(run)  # type: ignore[arg-type]
        return (rows[:-1] if getattr(run, "url", None) else rows), alerts

    monkeypatch.setattr(agree, "final_state", lossy)
    found = violation(scenario(1))
    assert isinstance(found, Violation)
    assert found.invariant == "stores agree" and "PostgreSQL" in found.detail
