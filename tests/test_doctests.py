"""The examples in receiver's docstrings are run: an example that no longer holds fails
here instead of misleading its reader."""

import doctest
import importlib
import pkgutil

import pytest

import receiver

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(receiver.__path__, prefix="receiver.")
    if not info.name.endswith("__main__")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_hold(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed"


def test_there_are_examples_to_run() -> None:
    attempted = sum(doctest.testmod(importlib.import_module(n)).attempted for n in MODULES)
    assert attempted >= 30
