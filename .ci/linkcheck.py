"""`make docs`' last step: every internal link and image of the built site resolves.

    python .ci/linkcheck.py site

Reads every HTML page under the site and, for each href and src that points inside it
(relative, or absolute with no host), checks that the file it names exists (a folder: its
index.html) and, for a #fragment, that the page it names has an element of that id.
mkdocs --strict checks the links written in Markdown; this checks what the built pages
hold, raw HTML in a page and the theme's own links included. Links to other sites are not
followed: the build may have no network, and their rot is not the build's. Exits 1 naming
each broken link and the page it is on.
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

_LINKING = {"href", "src"}


class _Page(HTMLParser):
    """The links (href, src) and the ids of one page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in _LINKING:
                self.links.append(value)
            elif name == "id" or (tag == "a" and name == "name"):
                self.ids.add(value)


def _read(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8", errors="replace"))
    return page


def _target(site: Path, page: str, link: str) -> tuple[Path, str] | None:
    """The file a link of page (its path in the site) names, and its fragment; None for a
    link out of the site (a scheme or a host: http:, mailto:, data:, ...)."""
    parts = urlsplit(link)
    if parts.scheme or parts.netloc:
        return None
    path = unquote(urlsplit(urljoin("/" + page, link)).path)
    if not parts.path:  # "#x" or "?q": this page
        path = "/" + page
    file = site / path.lstrip("/")
    if path.endswith("/") or file.is_dir():
        file = file / "index.html"
    return file, parts.fragment


def broken(site: Path) -> list[str]:
    """Each broken internal link of the site as "page: link (why)"."""
    pages = {p.relative_to(site).as_posix(): _read(p) for p in sorted(site.rglob("*.html"))}
    found = []
    for page, parsed in pages.items():
        for link in parsed.links:
            target = _target(site, page, link)
            if target is None:
                continue
            file, fragment = target
            name = file.relative_to(site).as_posix() if file.is_relative_to(site) else None
            if name is None or not file.is_file():
                found.append(f"{page}: {link} (no such file)")
            elif fragment and name in pages and unquote(fragment) not in pages[name].ids:
                found.append(f"{page}: {link} (no #{fragment} in {name})")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: linkcheck.py SITE_DIR", file=sys.stderr)
        return 2
    site = Path(argv[0]).resolve()
    pages = list(site.rglob("*.html"))
    if not pages:
        print(f"linkcheck: no HTML pages under {site}", file=sys.stderr)
        return 1
    found = broken(site)
    for line in found:
        print(f"broken link: {line}", file=sys.stderr)
    if found:
        print(f"linkcheck: {len(found)} broken links in {len(pages)} pages", file=sys.stderr)
        return 1
    print(f"linkcheck: every internal link and image of {len(pages)} pages resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
