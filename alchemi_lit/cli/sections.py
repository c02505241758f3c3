"""The sections of a run / validate config and the jsonargparse parser that reads them.

``simulator`` holds the arguments of :class:`~alchemi_lit.Simulator` (jsonargparse reads
its signature); ``data`` and ``output`` are the dataclasses below.  A
:meth:`CLI.add_arguments_to_parser` may add more; :class:`Sections` lists what a given
parser has, so config files and overrides accept exactly those keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class SamplerConfig:
    """Inflight batching budgets: the shorthand ``sampler: {max_atoms: ...}`` for
    :class:`~alchemi_lit.data.SizeAwareSampler` with these arguments.

    Args:
        max_atoms: most atoms in flight at once, or ``auto``: measured on the run's
            device (a fit of the model's memory on small probe batches).
        max_systems: most systems in flight at once (None: no limit).
        max_edges: most neighbour pairs in flight (None: no limit).
        skip_invalid: leave invalid or oversize structures out with a warning instead of
            failing (the summary lists them).
        memory_fraction: with ``max_atoms: auto``, the share of the free memory a full
            batch may take.
    """

    max_atoms: int | Literal["auto"]
    max_systems: int | None = None
    max_edges: int | None = None
    skip_invalid: bool = False
    memory_fraction: float = 0.8


@dataclass
class DataConfig:
    """What to run.

    Args:
        structures: a structure file any ASE reader understands (a relative path is
            looked up next to the config file first), or ``builtin:argon`` /
            ``builtin:mixed_argon``.
        builtin_args: keyword arguments of the built-in set (``n_systems``, ``repeat`` ...).
        format: ASE format name when the file extension does not tell it.
        index: which frames of the file to read (ASE syntax, ``":"`` = all).
        partial_occupancy: a structure with partially occupied sites (a disordered
            CIF) is refused (``error``), or each such site takes its majority species,
            with a warning (``majority``).
        first_id: number the structures' ``system_id`` from this value on (default:
            from 0, or the ids results of an earlier run carry), e.g. to append them to
            a results store that holds ids from 0 on.
        sampler: inflight batching: budgets for the built-in SizeAwareSampler
            (``{max_atoms: 20000, max_systems: 512, max_edges: null, skip_invalid: false}``)
            or a registered sampler (``{class_path: NAME, init_args: {...}}``, see
            ``alchemi-lit plugins --kind sampler``); without it the budget is measured
            (``max_atoms: auto``) on a CUDA device with the single strategy, else bounded
            (8192 atoms, or the model's CPU batch size), as the log says.
        constraints: ASE constraints given to every structure, after those its file
            carries: a list of ``{type: FixAtoms, tags: [2, 3]}``-style mappings (ASE's
            class name, its arguments, atoms chosen by ``indices`` or ``tags``; see
            :mod:`~alchemi_lit.data.constraint_specs`).
        shard: ``i/n`` (``--shard i/n``): run only shard ``i`` of ``n``, the contiguous
            structures ``[i*N//n, (i+1)*N//n)`` of the ``N``, keeping their global
            ``system_id``; every store, trajectory and checkpoint folder gets
            ``.shard-i-of-n`` before its suffix, so the shards of a job array never share
            one.
    """

    structures: str
    builtin_args: dict[str, Any] = field(default_factory=dict)
    format: str | None = None
    index: str | int = ":"
    partial_occupancy: Literal["error", "majority"] = "error"
    first_id: int | None = None
    sampler: dict[str, Any] | None = None
    constraints: list[dict[str, Any]] | None = None
    shard: str | None = None


@dataclass
class OutputConfig:
    """Where the resolved config (``<name>.config.yaml``) and summary (``<name>.summary.json``) go.

    Args:
        dir: output directory (default: the directory of the first ZarrSink store;
            nothing is written without one).
        name: file prefix (default: the stem of the first ZarrSink store).
        save_config: write the resolved config.
        save_summary: write the summary as JSON (and into the results store's attributes).
    """

    dir: str | None = None
    name: str | None = None
    save_config: bool = True
    save_summary: bool = True


@dataclass(frozen=True)
class Sections:
    """The top-level keys of a config: ``simulator``, ``data``, ``output`` and any a
    :meth:`CLI.add_arguments_to_parser` adds.  ``groups``: those holding nested keys
    (``--KEY file.yaml`` reads such a section from a file)."""

    names: tuple[str, ...] = ("simulator", "data", "output")
    groups: frozenset[str] = frozenset({"simulator", "data", "output"})

    @classmethod
    def of(cls, parser: Any) -> Sections:
        """The sections of a config parser (its options' first key)."""
        names: dict[str, bool] = {}
        for action in parser._actions:  # argparse's list of options
            top, dot, _ = action.dest.partition(".")
            if top not in ("help", "config", "print_config"):
                names[top] = names.get(top, False) or bool(dot)
        return cls(tuple(names), frozenset(k for k, nested in names.items() if nested))

    def options(self) -> str:
        """``--simulator., --data. or --output.``"""
        items = [f"--{n}." if n in self.groups else f"--{n}" for n in self.names]
        return ", ".join(items[:-1]) + f" or {items[-1]}" if len(items) > 1 else items[0]


def config_parser(prog: str, description: str) -> Any:
    """The jsonargparse parser of run / validate: the Simulator's arguments, data, output."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    from ..simulator import Simulator
    from .help_format import ReadableDefaults

    parser = ArgumentParser(
        prog=prog,
        description=description,
        exit_on_error=False,
        formatter_class=ReadableDefaults,
        env_prefix="ALCHEMI_LIT",
        default_env=False,
    )
    parser.add_argument(
        "--config", action=ActionConfigFile, help="YAML config file(s); later ones override"
    )
    parser.add_class_arguments(Simulator, "simulator", fail_untyped=False)
    parser.add_class_arguments(DataConfig, "data")
    parser.add_class_arguments(OutputConfig, "output")
    return parser
