import pytest

from receiver.notify.backoff import Backoff
from receiver.store import OutboxRow


def row(attempts: int, created_at: float = 0.0) -> OutboxRow:
    return OutboxRow(
        id=1,
        event_id="e",
        rule="r",
        notifier="n",
        target=0,
        title="t",
        body="b",
        state="sending",
        attempts=attempts,
        next_at=0,
        created_at=created_at,
        updated_at=0,
    )


@pytest.mark.parametrize(
    ("attempts", "delay"), [(1, 30), (2, 60), (3, 120), (7, 1920), (8, 3600), (20, 3600)]
)
def test_delay_doubles_from_initial_up_to_the_maximum(attempts: int, delay: float) -> None:
    assert Backoff(jitter=0).delay(attempts) == delay


def test_jitter_stays_within_its_share() -> None:
    delays = [Backoff(jitter=0.2).delay(3) for _ in range(200)]
    assert all(96 <= d <= 144 for d in delays)
    assert len(set(delays)) > 100  # spread, so retries of many rows don't land together


def test_a_row_is_dead_once_retrying_would_pass_give_up() -> None:
    backoff = Backoff(initial=30, maximum=3600, give_up=86400, jitter=0)
    assert backoff.retry_at(row(3, created_at=0), now=1000) == 1120
    assert backoff.retry_at(row(30, created_at=0), now=86000) is None
