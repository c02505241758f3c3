"""``alchemi-lit eos | elastic | phonons | vibrations | qha | order --config ...``: a
workflow from YAML.

The config has ``run``'s sections, read and checked by the same code (``simulator``:
the model, callbacks, sinks, precision ...; ``data``: the structures and the sampler's
budgets; ``output``: where the table goes), plus ``workflow``: the workflow's own
parameters (``strains``, ``supercell`` ..., and ``format``: csv or parquet).
``simulator.stages`` is the relaxation of every job (eos, elastic; vibrations: of every
structure before it is displaced); left out, the jobs
are single points (the resolved config says so: ``SinglePoint``).  The table and one
file per material go to ``output.dir`` (default ``results/<command>``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .argv import split_argv
from .command import Command, console_width
from .errors import CLIError

if TYPE_CHECKING:
    from .app import CLI

#: the stage that stands for "single points" in a config without stages
SINGLE_POINT = "alchemi_lit.workflows.jobs.SinglePoint"
#: the workflow functions' arguments a config gives elsewhere (or the CLI itself)
_GIVEN_ELSEWHERE = {"structures", "model", "relax", "max_atoms", "max_systems", "resume"}
_HELP = {
    "eos": "fit the equation of state of every structure (ASE's EquationOfState)",
    "elastic": "elastic tensors, moduli and Born stability of every structure",
    "phonons": "phonons of every structure through phonopy: bands, DOS, free energy",
    "vibrations": "vibrations and thermochemistry of molecules and adsorbates (ASE's)",
    "qha": "quasi-harmonic thermal expansion, B(T), G(T), Cp(T) through phonopy",
    "order": "orderings of partially occupied structures (CIF), relaxed and ranked by energy",
}
#: workflows whose jobs are phonopy's displaced supercells as they are (no stages)
_NO_STAGES = ("phonons", "qha")
#: more of a workflow's arguments a config gives elsewhere (order's seed: simulator.seed)
_ALSO_ELSEWHERE = {"order": {"seed"}}


class WorkflowCommand(Command):
    """One property workflow (``eos``, ``elastic``, ``phonons``, ``vibrations`` or
    ``qha``) run from a config."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.help = _HELP[name]

    def function(self) -> Any:
        from .. import workflows

        return getattr(workflows, self.name)

    def config_parser(self, cli: CLI) -> Any:
        """``run``'s parser (with the CLI's own additions) plus the ``workflow`` section."""
        from typing import Literal

        parser = cli.config_parser(self.name)
        skip = _GIVEN_ELSEWHERE | _ALSO_ELSEWHERE.get(self.name, set())
        parser.add_function_arguments(self.function(), "workflow", skip=skip)
        parser.add_argument(
            "--workflow.format",
            type=Literal["csv", "parquet"],
            default="csv",
            help="the table's format (written through pandas)",
        )
        return parser

    def invoke(self, cli: CLI, name: str, args: list[str]) -> int:
        from .help import class_help

        req = split_argv(args)
        if req.help is not None:
            code = class_help(f"{cli.prog} {name}", *req.help)
            if code is not None:
                return code
        return self.execute(cli, (req, self.parse(cli, req)))

    def parse(self, cli: CLI, req: Any) -> dict[str, Any]:
        """The resolved config: as ``run`` resolves it, the ``workflow`` section beside."""
        from ..core import registry
        from .checks import check_config
        from .config import merged_config, parse_config
        from .sections import Sections

        registry.all_entries()
        parser = self.config_parser(cli)
        conf = merged_config(req.configs, req.overrides, Sections.of(parser))
        if req.help_only:
            return parse_config(parser, {}, req.passthrough)
        sim = conf.setdefault("simulator", {})
        if isinstance(sim, dict) and sim.get("stages") in (None, [], ""):
            sim["stages"] = [{"class_path": SINGLE_POINT}]
        workflow = conf.pop("workflow", None)
        conf = check_config(conf)
        if workflow is not None:
            conf["workflow"] = workflow
        return parse_config(parser, conf, req.passthrough, {"workflow": self.function()})

    def execute(self, cli: CLI, cfg: Any) -> int:
        req, resolved = cfg
        resolved = cli.before_instantiate(resolved)
        resume = None if req.resume is False else req.resume
        started = time.time()
        args, options = self._arguments(resolved)
        table_format = options.pop("format", None) or "csv"
        results = self.function()(resume=resume, **args, **options)
        out, name = _output(resolved, self.name, args.get("sinks"))
        written = results.write(out, format=table_format)
        config = out / f"{name}.config.yaml"
        _save_config(config, resolved, self.name)
        _print_summary(results, time.time() - started, [*written[:1], config], out)
        return 0

    def _arguments(self, resolved: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the workflow's run arguments: structures, model, relax, budgets, Simulator
        arguments; its own parameters) from the resolved config."""
        from ..integrators.stages import as_plan
        from ..workflows.jobs import SinglePoint
        from .build import _read_structures, instantiate

        sim = dict(resolved["simulator"])
        model = instantiate(sim.pop("model"), "simulator.model")
        raw = sim.pop("stages")
        stages = instantiate(raw if isinstance(raw, list) else [raw], "simulator.stages")
        relax = None
        if not all(isinstance(s, SinglePoint) for s in stages):
            if self.name in _NO_STAGES:
                raise CLIError(
                    "simulator.stages",
                    f"{self.name} evaluates phonopy's displaced supercells as they are: "
                    f"leave stages out (relax the structures in a run before)",
                )
            relax = as_plan([s for s in stages if not isinstance(s, SinglePoint)])
        if sim.pop("stress", None) is not None:
            raise CLIError(
                "simulator.stress", "a workflow always computes the stress: leave it out"
            )
        kwargs = {k: instantiate(v, f"simulator.{k}") for k, v in sim.items() if v is not None}
        data = resolved["data"]
        if data.get("first_id") is not None:
            raise CLIError("data.first_id", "a workflow numbers its own jobs: leave it out")
        budgets = _budgets(data.get("sampler"))
        # (order reads partial occupancies, which run's reader refuses: the path as given)
        atoms = _disordered(data) if self.name == "order" else _read_structures(data)
        options = dict(resolved.get("workflow") or {})
        args = {"structures": atoms, "model": model, "relax": relax, **budgets, **kwargs}
        if self.name in _NO_STAGES:
            args.pop("relax")
        return args, options


def _disordered(data: dict[str, Any]) -> Any:
    """``order``'s input: the CIF(s) of ``data.structures`` (a file, or a folder of
    ``*.cif``), read by pymatgen with their partial occupancies."""
    spec = str(data["structures"])
    path = Path(spec)
    if path.is_dir():
        files = sorted(str(p) for p in path.glob("*.cif"))
        if not files:
            raise CLIError("data.structures", f"{spec!r} holds no *.cif files to order")
        return files
    if not path.is_file():
        raise CLIError("data.structures", f"{spec!r} is not a file: give a CIF with partial "
                       "occupancies (or a folder of them)")  # fmt: skip
    return [spec]


def _budgets(spec: dict[str, Any] | None) -> dict[str, Any]:
    """``data.sampler``'s budgets as the workflow's ``max_atoms`` / ``max_systems``."""
    if not spec:
        return {}
    extra = [k for k, v in spec.items() if k not in ("max_atoms", "max_systems") and v]
    if "class_path" in spec or extra:
        key = "data.sampler" + (f".{extra[0]}" if extra and "class_path" not in spec else "")
        raise CLIError(key, "a workflow takes the budgets max_atoms and max_systems only")
    return {k: spec.get(k) for k in ("max_atoms", "max_systems") if spec.get(k) is not None}


def _output(resolved: dict[str, Any], command: str, sinks: Any) -> tuple[Path, str]:
    """The output folder (``output.dir``; else next to the first ZarrSink store; else
    ``results/<command>``) and the file prefix of the config."""
    out = resolved.get("output") or {}
    folder = out.get("dir")
    if folder is None:
        stores = [s.path.parent for s in sinks or [] if hasattr(s, "path")]
        folder = stores[0] if stores else Path("results") / command
    return Path(folder), out.get("name") or command


def _save_config(path: Path, resolved: dict[str, Any], command: str) -> None:
    import yaml

    header = f"# resolved by alchemi-lit; re-run with: alchemi-lit {command} --config THIS_FILE\n"
    path.write_text(header + yaml.safe_dump(resolved, sort_keys=False))


def _print_summary(results: Any, wall: float, files: list[Path], out: Path) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    stats = results.jobs.results.stats
    table = Table(title=f"alchemi-lit {results.name}: summary", show_header=False)
    table.add_column("what", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_row("materials", f"{len(results)} ({len(results.failed)} failed)")
    table.add_row("jobs", f"{len(results.jobs.jobs)} in {stats.get('forward_calls')} forward calls")
    table.add_row("wall time", f"{wall:.1f} s")
    for i, why in list(results.failed.items())[:5]:
        table.add_row(f"failed: {i}", escape(why))
    table.add_row("written", escape(", ".join(str(f) for f in files) + f", {out}/{results.name}/"))
    Console(width=console_width()).print(table)
