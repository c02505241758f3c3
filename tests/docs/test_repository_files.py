"""The files a user meets first: a short README, the licence's full text, a valid citation.

The README is the door, not the manual (at most 10 KB, the rest is the site); LICENSE
must be the whole Apache-2.0 text pyproject.toml declares, not a pointer to it; the
citation file must carry what CFF 1.2.0 requires (cffconvert --validate checked the
schema when it was written; it is not a test dependency).
"""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_readme_is_at_most_10_kb_and_links_into_the_site():
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 10 * 1024, f"README.md is {len(text.encode())} bytes"
    for page in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / page).is_file(), f"README links {page}, which does not exist"


def test_license_is_the_full_apache_2_text():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    sections = ["Definitions", "Grant of Copyright License", "Grant of Patent License",
                "Redistribution", "Submission of Contributions", "Trademarks",
                "Disclaimer of Warranty", "Limitation of Liability",
                "Accepting Warranty or Additional Liability"]
    for k, title in enumerate(sections, start=1):
        assert f"{k}. {title}." in text, f"LICENSE lacks section {k} ({title})"
    assert "END OF TERMS AND CONDITIONS" in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "Apache-2.0"}


def test_citation_file_has_what_cff_requires():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0"
    assert cff["message"] and cff["title"] and cff["authors"]
    assert all("name" in a or "family-names" in a for a in cff["authors"])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert str(cff["version"]) == project["version"] and cff["license"] == "Apache-2.0"
