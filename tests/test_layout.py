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


def _ancestors(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _runs(name: str, path: Path, known: set[str]) -> set[str]:
    """The receiver modules that importing `name` runs: what it imports, and the packages an
    import runs first (`from receiver.rules.load import x` runs receiver/rules/__init__.py,
    which loads the channels, which load the store), short of its own packages, which run
    before it does."""
    found = _imports(name, path, known)
    mine = _ancestors(name) | {name}
    return found | {p for t in found for p in _ancestors(t) if p in known and p not in mine}


def test_no_import_circle_in_receiver() -> None:
    modules = _modules()
    graph = {name: _runs(name, path, set(modules)) for name, path in modules.items()}
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


# -- a top floor that reads like the design (issue 44) ----------------------------------------

# receiver/'s own modules and packages. A new one is a choice for DESIGN's layout, not a file
# that lands here: a concept with parts is a package (edge/, backtest/), a bottom helper a
# module that imports nothing above it.
TOP_FLOOR = {
    "__init__", "__main__", "app", "durations", "errors", "events", "links", "logs",
    "matchers", "metrics", "redact", "reloader", "retention", "sessions", "settings",
    "signature", "supervisor", "tracing", "why",
    "admin/", "api/", "backtest/", "cli/", "dispatch/", "edge/", "notify/", "rules/",
    "simulator/", "store/", "upstream/",
}  # fmt: skip

# What store/ may import besides itself: pure modules at the bottom. Not logs (it loads
# tracing and metrics), not rules (it loads the channels, which load the store).
STORE_MAY_IMPORT = {
    "receiver", "receiver.durations", "receiver.errors", "receiver.events",
    "receiver.matchers", "receiver.redact", "receiver.sessions",
}  # fmt: skip


def test_the_top_floor_holds_the_designed_modules_and_packages() -> None:
    found = {
        path.stem if path.is_file() else f"{path.name}/"
        for path in RECEIVER.iterdir()
        if (path.suffix == ".py" and path.is_file()) or any(path.glob("*.py"))
    }
    assert found == TOP_FLOOR


def test_store_imports_only_itself_and_the_bottom_modules() -> None:
    """Everything store/ runs at import, however far down: logs or tracing pulled in through
    a helper would load the metrics and the tracer into every tool that opens a store."""
    modules = _modules()
    graph = {name: _runs(name, path, set(modules)) for name, path in modules.items()}
    outside = set()
    for name in graph:
        if name.split(".")[:2] != ["receiver", "store"]:
            continue
        stack, seen = [name], {name}
        while stack:
            for target in graph[stack.pop()]:
                if target not in seen:
                    seen.add(target)
                    stack.append(target)
        outside |= {(name, t) for t in seen if t.split(".")[:2] != ["receiver", "store"]}
    assert sorted(f"{a} -> {b}" for a, b in outside if b not in STORE_MAY_IMPORT) == []


# -- bench/ and chaos/ under the same rules (issue 44) ----------------------------------------

TOOLS = [RECEIVER.parent / "bench", RECEIVER.parent / "chaos"]


def _package_modules(root: Path) -> dict[str, Path]:
    """A top-level package's modules by dotted name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _tool_modules() -> dict[str, Path]:
    return {name: path for root in TOOLS for name, path in _package_modules(root).items()}


def test_bench_and_chaos_are_packages_that_leave_sys_path_alone() -> None:
    """Run as `python -m bench.run`: a module that edits sys.path imports its siblings twice
    (once as `run`, once as `bench.run`) and hides a circle from the import graph."""
    assert [root.name for root in TOOLS if not (root / "__init__.py").exists()] == []
    edits = [
        f"{name}:{node.lineno}"
        for name, path in _tool_modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    ]
    assert edits == []


def test_no_bench_or_chaos_module_over_500_lines_or_function_over_80() -> None:
    long = []
    for name, path in _tool_modules().items():
        text = path.read_text()
        if (lines := len(text.splitlines())) > MODULE_LINES:
            long.append(f"{name}: {lines}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {length}")
    assert long == []


def _tool_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """_imports, and a bare `import run` of a sibling (bench/run.py, reached through a
    sys.path edit) counted as the sibling it is."""
    top = name.split(".")[0]
    bare = {
        f"{top}.{alias.name}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    return _imports(name, path, known) | {target for target in bare & known if target != name}


def test_no_import_circle_in_bench_or_chaos() -> None:
    modules = _tool_modules()
    graph = {name: _tool_imports(name, path, set(modules)) for name, path in modules.items()}
    circles = []
    for start in graph:
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


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_bench_and_chaos_use_no_private_name_of_another_module() -> None:
    """`from x import _y`, or `x._y` where x came from an import: what another module keeps
    to itself changes without notice; a bench that needs it asks for a public name."""
    found = []
    for name, path in _tool_modules().items():
        tree = ast.parse(path.read_text())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                imported.update(a.asname or a.name for a in node.names)
                found += [f"{name}: from {node.module} import {a.name}" for a in node.names
                          if _private(a.name)]  # fmt: skip
        found += [
            f"{name}:{node.lineno}: {node.value.id}.{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and _private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id in imported
        ]
    assert found == []


NAMED_TESTS = 0.70  # Starlette's share is 71%


def test_most_modules_have_a_test_file_named_after_them() -> None:
    """receiver/notify/worker.py is tested in a tests/**/test_worker.py (a private module's
    leading underscore dropped: cli/_workers.py in test_workers.py), so its tests are found
    by its name; a test of a concept that spans modules keeps the concept's name."""
    tests = {path.name for path in RECEIVER.parent.joinpath("tests").rglob("test_*.py")}
    modules = [
        path for path in RECEIVER.rglob("*.py") if path.name not in ("__init__.py", "__main__.py")
    ]
    unnamed = sorted(
        str(path.relative_to(RECEIVER.parent))
        for path in modules
        if f"test_{path.name.lstrip('_')}" not in tests
    )
    share = 1 - len(unnamed) / len(modules)
    assert share >= NAMED_TESTS, f"{share:.0%} of modules have a test_<module>.py; " + (
        "without one: " + ", ".join(unnamed)
    )
