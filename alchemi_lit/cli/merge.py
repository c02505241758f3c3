"""``alchemi-lit merge OUT IN [IN ...]``: join the results stores of a campaign's shards
(a SLURM job array, runs on several machines) into one, each system once, and write
the merged ``summary.json``.

The merge itself is :func:`alchemi_lit.sinks.merge_stores` (exactly once, resumable,
conflicting systems refused; see :mod:`alchemi_lit.sinks.merge`).  The summary of the
merged store -- every system, and one entry per shard's run with its own wall time
and throughput -- goes to ``OUT_STEM.summary.json`` next to ``OUT`` (or into
``--output_dir``), like the summary ``alchemi-lit run`` writes for each shard.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .command import Command, console_width
from .errors import CLIError

if TYPE_CHECKING:
    from .app import CLI


class MergeCommand(Command):
    """Merge results stores, then summarize the merged one."""

    help = "merge results stores (the shards of a job array) into one, each system once"

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("out", type=str, help="the merged store (created, or appended to)")
        parser.add_argument(
            "inputs", type=str, nargs="+", help="the results stores to merge (.zarr)"
        )
        parser.add_argument(
            "--chunk_systems",
            type=int,
            default=4096,
            help="systems read and written at a time (memory is one chunk)",
        )
        parser.add_argument(
            "--output_dir",
            type=str | None,
            default=None,
            help="folder for OUT_STEM.summary.json (default: OUT's folder)",
        )

    def execute(self, cli: CLI, cfg: Any) -> int:
        from rich.console import Console

        from ..report import store_summary, summary_table
        from ..sinks import merge_stores

        if cfg.chunk_systems < 1:
            raise CLIError("chunk_systems", f"must be >= 1, got {cfg.chunk_systems}")
        out = Path(cfg.out)
        # a refusal is a ConfigError: one line, exit status 2, nothing merged
        report = merge_stores(out, cfg.inputs, chunk_systems=cfg.chunk_systems)
        summary = store_summary(out)
        summary["merge"] = report
        folder = Path(cfg.output_dir) if cfg.output_dir is not None else out.parent
        path = folder / f"{out.stem}.summary.json"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(summary, indent=2))
        except OSError as exc:  # the merged store is complete; only the summary is lost
            raise CLIError(
                "output_dir", f"cannot write {str(path)!r} ({exc.strerror or exc}); the merged "
                f"store {str(out)!r} is complete -- choose a writable --output_dir"
            ) from exc  # fmt: skip
        merged = ", ".join(f"{m['path']} ({m['systems']})" for m in report["merged"]) or "none"
        where = [
            f"{out} (merged store: {summary['systems']} systems)",
            f"merged now: {merged}",
            *(f"already merged, skipped: {p}" for p in report["skipped"]),
            f"{path} (summary)",
        ]
        if report["duplicates"]:
            where.insert(2, f"{report['duplicates']} systems held identically twice: kept once")
        Console(width=console_width()).print(
            summary_table(summary, title="alchemi-lit merge: summary", where=where)
        )
        return 0
