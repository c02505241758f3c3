"""Every code block of README.md and docs/ runs (tests/docs/code_blocks.py says how).

One test per page runs its blocks in order in a fresh working directory (a copy of
``configs/`` in it, as in the repository root); a block skipped with a reason is its
own test, reported as skipped with that reason (or run, where its condition is false).
A page with blocks marked ``if(not SLOW, ...)`` runs a second time, every such block
included, in the slow tier.
"""

from __future__ import annotations

import re
import shutil
import sys
import types
from pathlib import Path
from unittest import SkipTest

import pytest
from code_blocks import ROOT, SYBIL, namespace, pages, skips, unknown_languages

PAGES = pages()


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


SLOW_PAGES = [path for path in PAGES if any("SLOW" in r for _, r in skips(path))]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", PAGES, ids=page_id)
def test_page_code_blocks_run(path, tmp_path, monkeypatch):
    run_page(path, tmp_path, monkeypatch, slow=False)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", SLOW_PAGES, ids=page_id)
def test_page_code_blocks_run_full_size(path, tmp_path, monkeypatch):
    run_page(path, tmp_path, monkeypatch, slow=True)


def run_page(path: Path, tmp_path: Path, monkeypatch, slow: bool) -> None:
    """Run a page's blocks in order, in one namespace, in a fresh working directory."""
    assert not unknown_languages(path), (
        f"{page_id(path)}: fenced blocks in {unknown_languages(path)}: write python, bash, "
        "yaml, toml or text (output), so that the tests can run them"
    )
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    document = SYBIL.parse(path)
    # the page's namespace is a module's, as a user's script or package would be: what
    # it defines pickles (checkpoints, ranks), and its classes name their module
    module = types.ModuleType("docs_page_" + re.sub(r"\W", "_", path.stem))
    module.__dict__.update(document.namespace, **namespace(slow))
    document.namespace = module.__dict__
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for example in document:
        try:
            example.evaluate()
        except SkipTest:
            continue  # reported by test_skipped_blocks_say_why


SKIPPED = [(path, line, reason) for path in PAGES for line, reason in skips(path)]


@pytest.mark.parametrize(
    ("path", "line", "reason"), SKIPPED, ids=[f"{page_id(p)}:{n}" for p, n, _ in SKIPPED]
)
def test_skipped_blocks_say_why(path, line, reason):
    """A skipped block is reported with its reason; a condition that is false here means
    the block ran in test_page_code_blocks_run."""
    reason = reason.strip()
    assert reason, f"{page_id(path)}:{line}: a skip directive without a reason"
    if reason.startswith("if"):
        scope = {**namespace(), "if_": lambda cond, reason=None: reason if cond else None}
        why = eval("if_" + reason[2:], scope)
        if why:
            pytest.skip(f"{page_id(path)}:{line}: {why}")
        return
    pytest.skip(f"{page_id(path)}:{line}: {eval(reason)}")
