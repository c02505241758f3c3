"""The parsers and evaluators that run the code blocks of README.md and docs/ (Sybil).

Each page is one document: its Python blocks run in order in one namespace (a page
reads as one session), its bash blocks in a shell, in the same working directory; a
YAML block whose first line is ``# file: NAME`` is written there as NAME for the blocks
after it (others are parsed); TOML blocks are parsed.  ``text`` blocks are output
listings and are not run.  A block that cannot run here says why on the line before
it: ``<!-- skip: next "reason" -->``, or ``<!-- skip: next if(not CUDA, reason="...") -->``
with the names of :func:`namespace`; ``if(not SLOW, ...)`` marks a block of full-size runs
that only ``make test-slow`` runs (docs/design: "Tested documentation").
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import tomllib
import yaml
from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parents[2]
#: the fenced-block languages a page may use; anything else is a page error
LANGUAGES = {"python", "bash", "yaml", "toml", "text"}
FENCE = re.compile(r"^```(\w*)", re.M)
SKIP = re.compile(r"<!-- skip: next (.*?) -->")
#: a shell block's limit: the page's commands are small runs
BASH_TIMEOUT_S = 240


def pages() -> list[Path]:
    """README.md, the root pages the site shows, and every page under docs/ (the
    generated pages are built from the code, not written)."""
    root = [ROOT / name for name in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")]
    return [*root, *sorted((ROOT / "docs").rglob("*.md"))]


def installed(name: str) -> bool:
    """Whether a package imports here (for ``skip: next if(not installed(...))``)."""
    return importlib.util.find_spec(name) is not None


def cuda() -> bool:
    """Whether a CUDA device is here, without importing torch where it is absent."""
    if not installed("torch"):
        return False
    import torch

    return torch.cuda.is_available()


def namespace(slow: bool = False) -> dict:
    """What a skip condition may name: ``SLOW`` is true in the slow tier's run of a page."""
    return {"CUDA": cuda(), "SLOW": slow, "installed": installed}


def run_bash(example) -> str | None:
    """Run a shell block with ``bash -e`` in the page's working directory."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                      os.environ.get("PYTHONPATH")]))}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", example.parsed],
                          capture_output=True, text=True, env=env, timeout=BASH_TIMEOUT_S)
    if proc.returncode:
        return (f"{example.path}, line {example.line}: the bash block exited "
                f"{proc.returncode}\n{example.parsed}\n--- output:\n{proc.stdout}\n{proc.stderr}")
    return None


def check_yaml(example) -> str | None:
    """Parse a YAML block; write it as NAME where its first line is ``# file: NAME``."""
    text = example.parsed
    yaml.safe_load(text)
    first = text.split("\n", 1)[0]
    if first.startswith("# file: "):
        Path(first[len("# file: "):].strip()).write_text(text)
    return None


def check_toml(example) -> str | None:
    """Parse a TOML block."""
    tomllib.loads(example.parsed)
    return None


SYBIL = Sybil(
    parsers=[
        PythonCodeBlockParser(),
        CodeBlockParser("bash", run_bash),
        CodeBlockParser("yaml", check_yaml),
        CodeBlockParser("toml", check_toml),
        SkipParser(),
    ],
)


def unknown_languages(path: Path) -> list[str]:
    """Fenced blocks of a page in a language the tests do not know how to run."""
    text = path.read_text()
    opening = FENCE.findall(text)[::2]  # every other fence opens a block
    return [lang or "(none)" for lang in opening if lang not in LANGUAGES]


def skips(path: Path) -> list[tuple[int, str]]:
    """(line, reason expression) of every skip directive of a page."""
    text = path.read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in SKIP.finditer(text)]
