"""The store is a seam: nothing above receiver/store/ writes SQL, touches sqlite3 or psycopg,
or imports a concrete store."""

from __future__ import annotations

import ast
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


# -- the shape of the house (issue 29): small rooms, one-way doors ---------------------------

MODULE_LINES = 500
FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    """receiver's modules by dotted name."""
    found = {}
    for path in sorted(RECEIVER.rglob("*.py")):
        parts = list(path.relative_to(RECEIVER.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The receiver modules `name` imports anywhere in its file (a function's lazy import
    counts: it closes a circle as surely at run time)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                # `from receiver.store import records` imports a module, not a name
                found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module)
    return {target for target in found if target in known and target != name}


def test_no_module_is_over_500_lines_and_no_function_over_80() -> None:
    long_modules, long_functions = [], []
    for name, path in _modules().items():
        text = path.read_text()
        if (lines := len(text.splitlines())) > MODULE_LINES:
            long_modules.append(f"{name}: {lines}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES:
                    long_functions.append(f"{name}.{node.name}: {length}")
    assert (long_modules, long_functions) == ([], [])


def test_no_import_circle_in_receiver() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    circles = []
    for start in graph:  # a depth-first walk from each module back to itself
        stack = [(start, [start])]
        seen: set[str] = set()
        while stack:
            node, trail = stack.pop()
            for target in graph[node]:
                if target == start:
                    circles.append(" -> ".join([*trail, start]))
                elif target not in seen:
                    seen.add(target)
                    stack.append((target, [*trail, target]))
    assert circles == []
