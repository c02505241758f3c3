"""mkdocs hook: nav sections that list every page of a folder (design records, benchmarks).

These folders hold one page per record; listing them by hand in mkdocs.yml would let a
new record fall out of the nav.  Pages are ordered by file name (numbered).  The nav is
completed in ``on_config``, before mkdocs checks that every page is in it.
"""

from __future__ import annotations

from pathlib import Path

#: nav section title -> the folder (under docs/) whose pages it lists
FOLDERS = {"Design records": "design", "Benchmarks": "benchmarks"}


def section(nav: list, title: str) -> list | None:
    """The children of the nav's top-level section ``title``."""
    for item in nav:
        if isinstance(item, dict) and title in item and isinstance(item[title], list):
            return item[title]
    return None


def listed(children: list) -> set[str]:
    """The page paths a nav section already names."""
    out = set()
    for child in children:
        out.update(child.values() if isinstance(child, dict) else [child])
    return {c for c in out if isinstance(c, str)}


def on_config(config):
    """Append each folder's pages not yet in the nav to its section."""
    docs = Path(config["docs_dir"])
    for title, folder in FOLDERS.items():
        children = section(config["nav"], title)
        if children is None:
            continue
        have = listed(children)
        for page in sorted((docs / folder).glob("*.md")):
            uri = f"{folder}/{page.name}"
            if uri not in have:
                heading = page.read_text().split("\n", 1)[0].lstrip("# ").replace("`", "")
                children.append({heading: uri})
    return config
