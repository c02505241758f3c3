"""The documentation site builds with warnings as errors, and its reference is complete.

One ``mkdocs build --strict`` into a temporary folder (``make docs`` builds the same
site into ``site/``); then every name of every public module's ``__all__`` must be in
the built site's inventory (``objects.inv``, written by mkdocstrings for each object it
rendered), and the command-line page must hold every command's own ``--help``.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for the module's tests."""
    pytest.importorskip("mkdocs", reason="no docs extra: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                      os.environ.get("PYTHONPATH")])),
           "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        # (no -q: mkdocs' --strict counts the warnings its log shows, and -q hides them --
        # a page linking outside docs/ built "clean" that way while `make docs` failed)
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
         "-d", str(out)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=240,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def inventory(site: Path) -> set[str]:
    """The object names of a Sphinx-style inventory (four header lines, then zlib)."""
    data = (site / "objects.inv").read_bytes()
    start = 0
    for _ in range(4):
        start = data.index(b"\n", start) + 1
    return {line.split(" ", 1)[0] for line in zlib.decompress(data[start:]).decode().splitlines()}


def public_names() -> list[str]:
    """``module.name`` for every name of every public module's ``__all__`` (imported: what
    a user can import; dunder names such as ``__version__`` have no docstring to render)."""
    names = []
    for path in sorted((ROOT / "alchemi_lit").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if any(p.startswith("_") for p in parts) or "__all__" not in path.read_text():
            continue
        module = importlib.import_module(".".join(parts))
        names += [f"{module.__name__}.{n}" for n in getattr(module, "__all__", ())
                  if not n.startswith("__")]
    return names


def test_docs_build_strict_and_reference_has_every_public_name(site):
    names = public_names()
    assert len(names) > 100  # the package's public API, not an empty scan
    missing = sorted(set(names) - inventory(site))
    assert not missing, f"{len(missing)} public names are not in the reference: {missing[:20]}"


def test_cli_reference_is_the_parsers_help(site):
    from alchemi_lit.cli import CLI

    page = (site / "reference" / "command-line" / "index.html").read_text()
    for command in CLI().subcommands():
        assert f"usage: alchemi-lit {command}" in page, f"no help of `alchemi-lit {command}`"


def test_benchmark_tables_come_from_the_records(site):
    """Every recorded table is on a page, with its provenance line."""
    import json

    records = [r for f in sorted((ROOT / "bench" / "results").glob("*.json"))
               for r in json.loads(f.read_text())]
    assert records
    page = (site / "benchmarks" / "records" / "index.html").read_text()
    for record in records:
        assert record["date"] in page and record["torch"] in page
