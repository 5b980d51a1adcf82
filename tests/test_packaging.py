"""The package installs quietly: pyproject.toml uses the forms current setuptools expects, so
`make run` and `make test` print no deprecation box (license table, editable strategy)."""

import tomllib
from pathlib import Path

PYPROJECT = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())


def test_license_is_an_spdx_expression_with_a_setuptools_that_reads_it() -> None:
    # A `license = {text = ...}` table makes setuptools >= 77 print a deprecation box on
    # every install; the SPDX string needs setuptools 77 or newer.
    assert PYPROJECT["project"]["license"] == "MIT"
    assert "setuptools>=77" in PYPROJECT["build-system"]["requires"]


def test_the_package_directory_is_declared_for_a_plain_editable_install() -> None:
    # Without it setuptools installs the flat layout with an import hook, and says so in a
    # boxed "Editable installation" notice each time.
    assert PYPROJECT["tool"]["setuptools"]["package-dir"] == {"": "."}
