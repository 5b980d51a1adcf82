"""The store is a seam: nothing above receiver/store/ writes SQL, touches sqlite3 or psycopg,
or imports a concrete store."""

from __future__ import annotations

import re
from pathlib import Path

RECEIVER = Path(__file__).resolve().parent.parent / "receiver"
FORBIDDEN = re.compile(
    r"\bsqlite3\b|\bpsycopg\b|SQLiteTx|PostgresTx|SQLiteStore|PostgresStore|tx\.conn"
    r"|receiver\.store\.(sqlite|postgres|sql|tx)\b"
    r"|\b(SELECT|INSERT INTO|UPDATE \w+ SET|DELETE FROM|CREATE TABLE)\b"
)


def test_nothing_above_the_store_knows_a_concrete_store_or_sql() -> None:
    found = [
        f"{path.relative_to(RECEIVER.parent)}:{n}: {line.strip()}"
        for path in sorted(RECEIVER.rglob("*.py"))
        if "store" not in path.relative_to(RECEIVER).parts[:1]
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if FORBIDDEN.search(line)
    ]
    assert found == []
