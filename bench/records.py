"""JSON records of the tables a benchmark prints: what the documentation's tables are.

Every table a script formats with ``common.format_table`` is kept, and when the script
ends they are written to ``bench/results/<script>-<UTC time>.json`` (or the folder
``ALCHEMI_BENCH_RESULTS`` names; ``ALCHEMI_BENCH_RESULTS=off`` writes nothing), one
record per table with where it was measured: the command, the machine, the processor,
the torch version and the date.  The site renders the records of ``bench/results/``
(docs/hooks/benchmarks.py), so a figure on a page always has its provenance.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import importlib.metadata
import json
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
_TABLES: list[dict[str, Any]] = []


def add(headers: Sequence[Any], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    """Keep one printed table for this process's record file."""
    if not _TABLES:
        atexit.register(write)
    _TABLES.append({
        "title": title or f"{Path(sys.argv[0]).stem} table {len(_TABLES) + 1}",
        "headers": [str(h) for h in headers],
        "rows": [[str(c) for c in row] for row in rows],
    })


def processor() -> str:
    """The CPU's model name (Linux), with the GPU's where torch sees one."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    torch = sys.modules.get("torch")  # only where the benchmark imported it
    if torch is not None and torch.cuda.is_available():
        name += f"; {torch.cuda.get_device_name(0)}"
    return name


def provenance() -> dict[str, str]:
    """Command, machine, processor, torch version and date of this run."""
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = "not installed"
    return {
        "command": " ".join(["python", *sys.argv]),
        "machine": os.environ.get("ALCHEMI_BENCH_MACHINE")
        or f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
        "processor": processor(),
        "torch": torch,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
    }


def write() -> Path | None:
    """Write the kept tables as one JSON file (at exit); the path, or None if off."""
    where = os.environ.get("ALCHEMI_BENCH_RESULTS", str(RESULTS))
    if not _TABLES or where == "off":
        return None
    folder = Path(where)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    path = folder / f"{Path(sys.argv[0]).stem}-{stamp}.json"
    meta = provenance()
    path.write_text(json.dumps([{**t, **meta} for t in _TABLES], indent=1,
                               ensure_ascii=False) + "\n")
    _TABLES.clear()
    print(f"records: {path}", file=sys.stderr)
    return path
