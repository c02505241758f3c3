"""``alchemi-lit run`` and ``alchemi-lit validate``: one config, built and checked the same
way; ``run`` then runs it, writes the resolved config and summary and prints the summary,
``validate`` prints what it built and runs nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..core.environment import numerics_environment
from .argv import split_argv
from .build import Built, build, check_structures
from .command import Command, console_width
from .errors import CLIError

if TYPE_CHECKING:
    from .app import CLI


class RunRequest(NamedTuple):
    """What ``run``/``validate`` parsed: the split command line and the resolved config."""

    argv: Any
    config: Any


class RunCommand(Command):
    """``run`` (``validate=False``) or ``validate`` (``validate=True``) a config."""

    def __init__(self, validate: bool = False) -> None:
        self.validate = validate
        self.help = (
            "build and check a config (model, plan, sinks, structures); run nothing"
            if validate
            else "run a config: relax / simulate every structure, write the sinks, print a summary"
        )

    def invoke(self, cli: CLI, name: str, args: list[str]) -> int:
        """Parsed by the CLI's own config parser (the whole ``simulator``/``data``
        tree, ``--resume``, per-class help), not by :meth:`add_arguments`."""
        from .help import class_help

        req = split_argv(args)
        if req.help is not None:
            code = class_help(f"{cli.prog} {name}", *req.help)
            if code is not None:
                return code
        return self.execute(cli, RunRequest(req, cli.parse(name, req)))

    def execute(self, cli: CLI, cfg: RunRequest) -> int:
        req = cfg.argv
        resolved = cli.before_instantiate(cfg.config)
        resume = None if req.resume is False else req.resume  # PATH, or True: the default
        resuming = not self.validate and resume is not None
        built = build(resolved, resuming, simulator=cli.build_simulator)
        facts = check_structures(built, full=self.validate)
        if self.validate:
            _print_validation(built, facts)
            return 0
        return _run(built, resolved, resume)


def _describe_sink(sink: Any) -> str:
    from ..sinks import HostMemory, ZarrSink

    if isinstance(sink, ZarrSink):
        return f"{sink.path} (ZarrSink, mode {sink.mode!r})"
    if isinstance(sink, HostMemory):
        return f"host memory (capacity {sink.capacity or 'unlimited'})"
    return type(sink).__name__


def _print_validation(built: Built, facts: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    sim = built.sim
    table = Table(
        title="alchemi-lit validate: OK, nothing was run", show_header=False, title_justify="left"
    )
    table.add_column("what", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    model = sim.model
    table.add_row("model", f"{type(model).__name__} (cutoff {model.cutoff:g} Å)")
    table.add_row("plan", escape(repr(sim.plan)))
    table.add_row("callbacks", ", ".join(type(c).__name__ for c in sim.callbacks) or "none")
    sinks = sim.sinks if sim.sinks is not None else []
    table.add_row(
        "sinks", escape("; ".join(_describe_sink(s) for s in sinks) or "host memory (default)")
    )
    table.add_row("device", f"{sim.device} | precision {sim.precision} | seed {sim.seed}")
    table.add_row(
        "structures",
        f"{facts['systems']} systems, {facts['atoms']} atoms, elements {facts['elements']}",
    )
    src = built.source
    budget = (
        f"max_atoms {src.max_atoms}, max_systems {src.max_systems or '-'}, "
        f"max_edges {src.max_edges or '-'}"
    )
    table.add_row("batching", f"inflight ({budget})")
    if src.shard is not None:
        ids = f"system_ids {int(src.system_ids.min())}-{int(src.system_ids.max())}"
        table.add_row("shard", f"{src.shard[0]}/{src.shard[1]} ({len(src)} systems, {ids})")
    Console(width=console_width()).print(table)


def _output_paths(built: Built) -> tuple[Path | None, Path | None]:
    from ..sinks import ZarrSink

    out = built.output
    zarr_sinks = [s for s in (built.sim.sinks or []) if isinstance(s, ZarrSink)]
    folder = out.get("dir")
    name = out.get("name")
    if folder is None and zarr_sinks:
        folder = str(zarr_sinks[0].path.parent)
    if name is None:
        name = zarr_sinks[0].path.stem if zarr_sinks else "run"
    if folder is None:
        return None, None
    base = Path(folder)
    config = base / f"{name}.config.yaml" if out.get("save_config", True) else None
    summary = base / f"{name}.summary.json" if out.get("save_summary", True) else None
    return config, summary


def _run(built: Built, resolved: dict[str, Any], resume: str | bool | None = None) -> int:
    import yaml
    from rich.console import Console

    from ..sinks import HostMemory, ZarrSink

    sim = built.sim
    sim.config = resolved
    if not is_main_rank():  # a rank a launcher re-executed: it runs, rank 0 reports
        sim.run(built.source, resume=resume)
        return 0
    config_path, summary_path = _output_paths(built)
    header = "# resolved by alchemi-lit; re-run with: alchemi-lit run --config THIS_FILE\n"
    config_text = header + yaml.safe_dump(resolved, sort_keys=False)
    if config_path is not None and resume is None:
        _write_output(config_path, config_text, built)
    zarr_sinks = [s for s in (sim.sinks or []) if isinstance(s, ZarrSink)]
    start_rows = _store_rows(zarr_sinks[0]) if zarr_sinks else 0
    results = sim.run(built.source, resume=resume)
    if config_path is not None and resume is not None:  # (only once the resume was accepted)
        _write_output(config_path, config_text, built)

    from ..report import read_store_systems, summarize, summary_table

    in_memory = sim.sinks is None or any(
        isinstance(s, HostMemory) and s.capacity is None for s in sim.sinks
    )
    if zarr_sinks and not in_memory:
        systems = read_store_systems(zarr_sinks[0].path, start=start_rows)
    else:
        batch = results.batch
        systems = (
            {} if batch is None else {k: v.detach().cpu().numpy() for k, v in batch.system.items()}
        )
    k = int(systems["stage_steps"].shape[1]) if "stage_steps" in systems else len(sim.plan.stages)
    names = sim.stage_names()
    if len(names) != k:  # e.g. appended to a store an older plan wrote
        names = [f"stage {i}" for i in range(k)]
    summary = summarize(systems, names, results.stats, _optimizer_flags(sim.plan, k))
    if sim.model.summary_note:  # a caveat such as ASECalculatorModel's slow path
        summary["model_note"] = sim.model.summary_note
    summary["environment"] = numerics_environment()  # (comparing across machines: #41)
    thermo = _thermo_temperature(sim)
    if thermo is not None:
        summary["temperature_K"] = thermo
    where = [_describe_sink(s) for s in (sim.sinks or [])] or ["host memory (no sink configured)"]
    if config_path is not None:
        where.append(f"{config_path} (resolved config)")
    if summary_path is not None:
        _write_output(summary_path, json.dumps(summary, indent=2), built)
        where.append(f"{summary_path} (summary)")
        for sink in zarr_sinks:
            _annotate_store(sink.path, summary)
    Console(width=console_width()).print(
        summary_table(summary, title="alchemi-lit run: summary", where=where)
    )
    return 0


def _optimizer_flags(plan: Any, k: int) -> list[bool] | None:
    """Which of the ``k`` stage-history columns are optimizer stages (None: unknown)."""
    from ..integrators.stages import Fused

    if isinstance(plan, Fused):
        flags = [bool(s.is_optimizer) for s in plan.stages]
    else:  # a pipeline (replicas repeat its columns)
        columns = set(plan.optimizer_columns())
        flags = [c in columns for c in range(k)]
    return flags if len(flags) == k else None


def _write_output(path: Path, text: str, built: Built) -> None:
    """Write the resolved config or summary; a failure names the key that chose ``path``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        from ..sinks import ZarrSink

        key = "output.dir"
        if built.output.get("dir") is None:  # next to the first ZarrSink store
            first = next(i for i, s in enumerate(built.sim.sinks) if isinstance(s, ZarrSink))
            key = f"simulator.sinks.{first}.init_args.store"
        raise CLIError(
            key,
            f"cannot write {str(path)!r} ({exc.strerror or exc}); choose a writable output.dir "
            f"(or store location)",
        ) from exc


def is_main_rank() -> bool:
    """False in the extra processes of a multi-rank launch (Fabric, torchrun, SLURM)."""
    from ..strategies.launch import process_rank

    return process_rank() == 0


def _store_rows(sink: Any) -> int:
    if sink.mode != "a" or not sink.path.exists():
        return 0
    import zarr

    try:
        return int(zarr.open_group(str(sink.path), mode="r").attrs.get("n_systems", 0))
    except Exception:
        return 0


def _annotate_store(path: Path, summary: dict[str, Any]) -> None:
    """Add the run summary (wall time, throughput) to the store's last ``runs`` entry."""
    import zarr

    try:
        group = zarr.open_group(str(path), mode="r+")
        runs = list(group.attrs.get("runs", []))
        if runs:
            runs[-1] = {**runs[-1], "summary": summary}
            group.attrs["runs"] = runs
    except Exception as exc:  # the results are safe; only the annotation is lost
        from loguru import logger

        logger.warning(f"could not add the run summary to {path}: {exc}")


def _thermo_temperature(sim: Any) -> float | None:
    """Mean temperature over the last tenth of a ThermoMonitor's records, if there is one."""
    from ..callbacks import ThermoMonitor

    for cb in sim.callbacks:
        if isinstance(cb, ThermoMonitor):
            rec = cb.records()
            if len(rec["T"]) == 0:
                return None
            last = rec["loop_step"] >= 0.9 * rec["loop_step"].max()
            return float(rec["T"][last].mean())
    return None
