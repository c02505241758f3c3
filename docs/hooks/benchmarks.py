"""mkdocs hook: benchmark tables rendered from the JSON records under ``bench/results/``.

A page marks where a table goes with ``<!-- bench-table: FILE INDEX -->`` (the INDEX-th
record of ``bench/results/FILE``); the hook renders it with its provenance line
(command, machine, processor, torch version, date).  ``benchmarks/records.md`` lists
every record, including those the bench scripts wrote after the pages were written
(``bench/common.py`` writes one per table a script prints).  A marker naming a missing
record stops the build.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
MARKER = re.compile(r"<!-- bench-table: (\S+) (\d+) -->")
FIELDS = ("command", "machine", "processor", "torch", "date")


def load(name: str) -> list[dict]:
    """The records of one results file."""
    path = RESULTS / name
    if not path.is_file():
        raise PluginError(f"benchmark record file {path} does not exist (named by a page)")
    return json.loads(path.read_text())


def render(record: dict) -> str:
    """One record as a markdown table with its provenance line above it."""
    missing = [f for f in (*FIELDS, "headers", "rows") if f not in record]
    if missing:
        raise PluginError(f"benchmark record {record.get('title')!r} lacks {missing}")

    def row(cells: list) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    provenance = (
        f"*`{record['command']}` -- {record['machine']}; {record['processor']}; "
        f"torch {record['torch']}; {record['date']}*"
    )
    lines = [provenance, "", row(record["headers"]), row(["---"] * len(record["headers"]))]
    lines += [row(r) for r in record["rows"]]
    return "\n".join(lines) + "\n"


def on_page_markdown(markdown, page, config, files):
    """Replace each table marker by its rendered record."""

    def repl(match: re.Match) -> str:
        records = load(match.group(1))
        k = int(match.group(2))
        if k >= len(records):
            raise PluginError(f"{match.group(1)} has {len(records)} records, not {k + 1}")
        return render(records[k])

    return MARKER.sub(repl, markdown)


def records_page() -> str:
    """Every record of bench/results, file by file."""
    lines = ["# All benchmark records", "",
             "Every JSON record under `bench/results/`, as written (newest files last).", ""]
    for path in sorted(RESULTS.glob("*.json"), key=lambda p: (p.stat().st_mtime, p.name)):
        lines += [f"## `{path.name}`", ""]
        for record in json.loads(path.read_text()):
            lines += [f"### {record['title']}", "", render(record), ""]
    return "\n".join(lines)


def on_files(files, config):
    """Add the generated page of all records."""
    files.append(File.generated(config, "benchmarks/records.md", content=records_page()))
    return files
