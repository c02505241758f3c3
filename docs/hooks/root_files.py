"""mkdocs hook: the repository's CHANGELOG.md and CONTRIBUTING.md as site pages.

They stay at the repository root, where people look for them; the site shows the same
files (no copy to drift).
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"changelog.md": "CHANGELOG.md", "contributing.md": "CONTRIBUTING.md"}


def on_files(files, config):
    """Add each root file as a page."""
    for page, source in PAGES.items():
        files.append(File.generated(config, page, content=(ROOT / source).read_text()))
    return files
