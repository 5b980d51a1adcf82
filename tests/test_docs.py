"""The documentation site as `make docs` builds it: the built pages' links and images all
resolve (.ci/linkcheck.py, which fails the build on one that does not), and nothing but
the site goes into site/ (no bytecode of docs/hooks.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINKCHECK = ROOT / ".ci" / "linkcheck.py"


def linkcheck(site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(LINKCHECK), str(site)], capture_output=True, text=True, timeout=60
    )


def page(site: Path, path: str, body: str) -> None:
    file = site / path
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(f"<!doctype html><html><body>{body}</body></html>")


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A small built site whose every link resolves."""
    root = tmp_path / "site"
    page(root, "index.html", '<a href="admin/">admin</a> <a href="admin/#phone">phone</a>')
    page(
        root,
        "admin/index.html",
        '<h2 id="phone">Phone</h2><img src="../shots/a.png"> <a href="../">home</a>'
        ' <a href="#phone">here</a> <a href="https://example.com/gone">out</a>'
        ' <a href="mailto:x@example.com">mail</a> <img src="data:image/png;base64,AA==">',
    )
    (root / "shots").mkdir()
    (root / "shots" / "a.png").write_bytes(b"png")
    return root


def test_a_site_whose_links_all_resolve_passes(site: Path) -> None:
    done = linkcheck(site)
    assert done.returncode == 0, done.stderr
    assert "every internal link and image of 2 pages resolves" in done.stdout


@pytest.mark.parametrize(
    ("body", "said"),
    [
        pytest.param('<img src="shots/a.png">', "shots/a.png (no such file)", id="an image"),
        pytest.param('<a href="../nowhere/">x</a>', "../nowhere/ (no such file)", id="a page"),
        pytest.param('<a href="/shots/b.png">x</a>', "/shots/b.png (no such file)", id="absolute"),
        pytest.param('<a href="../#gone">x</a>', "../#gone (no #gone in index.html)", id="anchor"),
        pytest.param(
            '<a href="../../../etc/passwd">x</a>', "../../../etc/passwd (no such file)", id="out"
        ),
    ],
)
def test_a_broken_internal_link_or_image_fails_it(site: Path, body: str, said: str) -> None:
    page(site, "admin/more.html", body)
    done = linkcheck(site)
    assert done.returncode == 1
    assert f"broken link: admin/more.html: {said}" in done.stderr
    assert "1 broken links in 3 pages" in done.stderr


def test_the_built_site_has_no_broken_link_and_no_bytecode(tmp_path: Path) -> None:
    """What `make docs` builds: the admin page's phone picture (once a raw <img> whose
    path the build did not rewrite) resolves, and docs/hooks.py's bytecode, written when
    mkdocs imports it, is not copied into the site."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    built = tmp_path / "site"
    for _ in range(2):  # the second build finds docs/__pycache__ there for sure
        done = subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(built)],
            cwd=ROOT,
            env=env | {"NO_MKDOCS_2_WARNING": "1"},
            capture_output=True,
            text=True,
            timeout=110,
        )
        assert done.returncode == 0, done.stderr
    assert (ROOT / "docs" / "__pycache__").is_dir()
    assert not list(built.rglob("__pycache__")) and not list(built.rglob("*.pyc"))
    checked = linkcheck(built)
    assert checked.returncode == 0, checked.stderr
    assert 'src="../screenshots/events-phone.png"' in (built / "admin" / "index.html").read_text()
