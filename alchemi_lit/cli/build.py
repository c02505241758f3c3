"""The resolved config -> the objects of a run (Simulator, structures, sampler), checked.

Objects are instantiated one by one rather than by jsonargparse's ``instantiate``, so a
constructor's ``ValueError`` is reported under the key of the object that raised it
(``simulator.stages.0.init_args.dt: ...``).  Before anything runs, the stores are
checked (an existing store that ``mode: w-`` protects, ids already stored, no write
permission) and the structures against the model and the budgets.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from .checks import dataclass_params
from .config import BUILTIN_PREFIX
from .errors import CLIError, key_for, one_line
from .names import check_function_args, function_params, import_class


@dataclass
class Built:
    """Everything a run needs."""

    sim: Any  # the Simulator
    structures: Any  # a list of ase.Atoms (a built-in set) or a dataset read on access
    source: Any  # a SizeAwareSampler (the data.sampler section's, or the default budget's)
    data: dict[str, Any]
    output: dict[str, Any]


def instantiate(value: Any, key: str) -> Any:
    """Build plugins (dicts with class_path) recursively; errors name the key."""
    if isinstance(value, dict) and isinstance(value.get("class_path"), str):
        cls = import_class(value["class_path"], f"{key}.class_path")
        init = value.get("init_args") or {}
        kwargs = {k: instantiate(v, f"{key}.init_args.{k}") for k, v in init.items()}
        kwargs.update(value.get("dict_kwargs") or {})
        try:
            return cls(**kwargs)
        except Exception as exc:
            raise CLIError(
                key_for(exc, f"{key}.init_args", list(kwargs), key), one_line(str(exc))
            ) from exc
    if isinstance(value, list):
        return [instantiate(v, f"{key}.{i}") for i, v in enumerate(value)]
    return value


def build_simulator(config: dict[str, Any]) -> Any:
    """The :class:`~alchemi_lit.Simulator` of ``config["simulator"]``."""
    from ..simulator import Simulator

    kwargs = {k: instantiate(v, f"simulator.{k}") for k, v in config["simulator"].items()}
    for k, cls in dataclass_params(Simulator).items():  # e.g. buffer: BufferConfig
        if isinstance(kwargs.get(k), dict):
            try:
                kwargs[k] = cls(**kwargs[k])
            except Exception as exc:
                raise CLIError(
                    key_for(exc, f"simulator.{k}", list(kwargs[k]), f"simulator.{k}"),
                    one_line(str(exc)),
                ) from exc
    try:
        return Simulator(**kwargs)
    except Exception as exc:
        raise CLIError(
            key_for(exc, "simulator", list(kwargs), "simulator"), one_line(str(exc))
        ) from exc


def build(
    resolved: dict[str, Any],
    resuming: bool = False,
    simulator: Callable[[dict[str, Any]], Any] = build_simulator,
) -> Built:
    """Everything a run needs, checked; ``resuming``: the stores hold this very run's
    results so far, so they are not refused for existing or holding its ids.
    ``simulator`` builds the Simulator from the config (:meth:`CLI.build_simulator`)."""
    data = resolved["data"]
    shard = data.get("shard")
    if shard is not None:
        from ..data.datasets import parse_shard

        try:
            parse_shard(shard)
        except Exception as exc:
            raise CLIError("data.shard", one_line(str(exc))) from exc
        shard_outputs(resolved, shard)
    sim = simulator(resolved)
    structures = _constrained(_read_structures(data), data.get("constraints"))
    from ..integrators.proposal_copies import expand

    structures = expand(sim.plan, structures)  # proposals=k (SwapMC, SemiGrandMC): k rows a chain
    first = data.get("first_id")
    ids = None if first is None else range(int(first), int(first) + len(structures))
    spec = data.get("sampler")
    source: Any
    if spec:
        from ..data import SizeAwareSampler

        if "class_path" in spec:  # a registered sampler: its init_args (may hold plugins)
            cls = import_class(spec["class_path"], "data.sampler.class_path")
            prefix = "data.sampler.init_args"
            args = {
                k: instantiate(v, f"{prefix}.{k}") for k, v in (spec["init_args"] or {}).items()
            }
            if ids is not None:
                raise CLIError("data.first_id", "applies to the built-in sampler only")
        else:  # the budgets shorthand
            cls, prefix, args = SizeAwareSampler, "data.sampler", dict(spec)
            if ids is not None:
                args["system_ids"] = ids
        extra = {} if shard is None else {"shard": shard}
        try:
            source = cls(structures, **args, **extra)
        except Exception as exc:
            key = (
                "data.shard"
                if "shard" in str(exc)
                else key_for(exc, prefix, list(args), "data.sampler")
            )
            raise CLIError(key, one_line(str(exc))) from exc
    else:
        source = _default_sampler(sim, structures, ids, shard)
    _check_sinks(sim, resolved, source, resuming)
    return Built(sim, structures, source, data, resolved.get("output") or {})


def _default_sampler(sim: Any, structures: Any, ids: Any, shard: str | None) -> Any:
    """No data.sampler section: the default budget (measured on CUDA, else bounded)."""
    from ..data.default_budget import default_budget_sampler
    from ..models.base import cpu_batch_atoms
    from ..strategies.distributed import DistributedStrategy

    try:
        return default_budget_sampler(
            structures, sim.device.type, not isinstance(sim.strategy, DistributedStrategy),
            cpu_batch_atoms(sim.model), system_ids=ids, shard=shard,
        )  # fmt: skip
    except Exception as exc:
        key = "data.shard" if "shard" in str(exc) else "data.structures"
        raise CLIError(key, one_line(str(exc))) from exc


def shard_outputs(resolved: dict[str, Any], shard: str) -> None:
    """Give every output a shard writes its own name: ``results.zarr`` ->
    ``results.shard-0-of-4.zarr`` (ZarrSink stores, TrajectoryWriter and observables
    stores, Checkpoint folders, output.name), so the shards of a job array never write
    into one file and each resumes on its own."""
    from ..callbacks import Checkpoint, Observable, TrajectoryWriter
    from ..data.datasets import parse_shard
    from ..sinks import ZarrSink

    index, count = parse_shard(shard)
    tag = f".shard-{index}-of-{count}"
    sim = resolved["simulator"]
    fields = ((ZarrSink, "store"), (TrajectoryWriter, "path"), (Checkpoint, "dirpath"),
              (Observable, "path"))  # fmt: skip
    for key in ("sinks", "callbacks"):
        for i, entry in enumerate(sim.get(key) or []):
            if not (isinstance(entry, dict) and isinstance(entry.get("class_path"), str)):
                continue
            cls = import_class(entry["class_path"], f"simulator.{key}.{i}.class_path")
            init = entry.setdefault("init_args", {}) or {}
            entry["init_args"] = init
            for base, name in fields:
                if isinstance(cls, type) and issubclass(cls, base):
                    default = "checkpoints" if base is Checkpoint else None
                    value = init.get(name, default)
                    if value is not None:
                        init[name] = str(shard_path(value, tag))
    out = resolved.get("output") or {}
    if out.get("name"):
        out["name"] = f"{out['name']}{tag}"


def shard_path(path: str | Path, tag: str) -> Path:
    """``path`` with ``tag`` before its suffix (``a/results.zarr`` -> ``a/results<tag>.zarr``;
    no suffix: appended)."""
    p = Path(path)
    return p.with_name(f"{p.stem}{tag}{p.suffix}") if p.suffix else p.with_name(p.name + tag)


def _constrained(structures: Any, specs: Any) -> Any:
    """``structures`` with ``data.constraints`` applied to each (on access)."""
    if not specs:
        return structures
    from ..data.constraint_specs import ConstrainedDataset

    try:
        return ConstrainedDataset(structures, specs)
    except ConfigError as exc:
        text = str(exc)
        raise CLIError(text.split(":", 1)[0], one_line(text.split(":", 1)[1])) from exc


def _read_structures(data: dict[str, Any]) -> Any:
    """A built-in set (a list of ase.Atoms), or a structure file, folder, pattern or
    store as a dataset read on access (:func:`~alchemi_lit.data.open_dataset`)."""
    from ..data import BUILTIN_SETS, open_dataset

    spec = data["structures"]
    args = data.get("builtin_args") or {}
    if spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX) :]
        if name not in BUILTIN_SETS:
            close = difflib.get_close_matches(name, BUILTIN_SETS, n=1)
            hint = f" Did you mean builtin:{close[0]}?" if close else ""
            known = ", ".join(f"builtin:{k}" for k in BUILTIN_SETS)
            raise CLIError(
                "data.structures", f"unknown built-in set {name!r}.{hint} Known: {known}"
            )
        fn = BUILTIN_SETS[name]
        params = function_params(fn)
        for k in args:
            if params is not None and k not in params:
                close = difflib.get_close_matches(str(k), sorted(params), n=1)
                hint = f" Did you mean {close[0]}?" if close else ""
                raise CLIError(
                    f"data.builtin_args.{k}",
                    f"builtin:{name} has no argument {k!r}.{hint} "
                    f"Arguments: {', '.join(sorted(params))}",
                )
        check_function_args(fn, args, "data.builtin_args")
        try:
            return fn(**args)
        except Exception as exc:
            raise CLIError(
                key_for(exc, "data.builtin_args", list(args), "data.builtin_args"),
                one_line(str(exc)),
            ) from exc
    try:
        atoms = open_dataset(
            spec, index=data.get("index") or ":", format=data.get("format"),
            partial_occupancy=data.get("partial_occupancy") or "error",
        )  # fmt: skip
    except Exception as exc:
        text = str(exc)
        key = "data.structures"
        if text.startswith("index "):
            key = "data.index"
        elif text.startswith("partial_occupancy"):
            key = "data.partial_occupancy"
        elif text.startswith("unknown structure file format"):
            key = "data.format"
        raise CLIError(key, one_line(text)) from exc
    if args:
        raise CLIError(
            "data.builtin_args", f"only applies to builtin: sets, not to the file {spec!r}"
        )
    return atoms


def _check_sinks(sim: Any, resolved: dict[str, Any], source: Any, resuming: bool) -> None:
    """Refuse, before anything runs, to write into an existing store that mode 'w-'
    protects, to append to a store systems whose ids it already holds, or to write
    where no store can be created (a file in the way, no permission)."""
    from ..simulator import input_system_ids
    from ..sinks import ZarrSink, id_list

    ids = input_system_ids(source)
    out = resolved.get("output") or {}
    if out.get("dir") is not None:
        _check_writable(Path(out["dir"]), "output.dir", "output directory")
    keys = [f"simulator.sinks.{i}" for i in range(len(resolved["simulator"].get("sinks") or []))]
    for key, sink in zip(keys, sim.sinks or []):
        if isinstance(sink, ZarrSink):
            _check_writable(sink.path, f"{key}.init_args.store", "results store")
        if resuming:
            continue
        if isinstance(sink, ZarrSink) and sink.mode == "w-" and sink.path.exists():
            raise CLIError(
                f"{key}.init_args.store",
                f"results store {str(sink.path)!r} already exists and mode is 'w-'; set "
                f"{key}.init_args.mode to 'a' (append) or 'w' (replace), or choose another path",
            )
        clash = sink.id_clashes(ids) if isinstance(sink, ZarrSink) and ids is not None else []
        if len(clash):
            raise CLIError(
                f"{key}.init_args.store",
                f"results store {str(sink.path)!r} already holds system_id(s) {id_list(clash)} "
                f"of these structures; set {key}.init_args.mode to 'w' (replace), choose "
                f"another store, or number the structures past the stored ids "
                f"(data.first_id)",
            )


def _check_writable(path: Path, key: str, what: str) -> None:
    """``path`` is (or can be created as) a writable directory; creates nothing."""
    from ..sinks.zarr import unwritable

    why = unwritable(path)
    if why is not None:
        raise CLIError(
            key, f"cannot create {what} {str(path)!r}: {why}; choose a writable location"
        )


def check_structures(built: Built, full: bool) -> dict[str, Any]:
    """Model supports every element (cheap); with ``full`` every structure is validated
    and the sampler budgets are checked (``sampler.bind``).  Returns facts for display."""
    import numpy as np
    from ase.data import chemical_symbols

    from ..models.base import unsupported_elements

    sim, sampler = built.sim, built.source
    model = sim.model
    supported = getattr(model, "supported_elements", None)
    if supported is not None and not sampler.elements <= set(supported):
        found: dict[int, list[int]] = {}  # (only on the way to an error: name them all)
        for k in range(len(sampler.dataset)):
            for z in set(np.unique(sampler.dataset[k].numbers).tolist()) - set(supported):
                found.setdefault(z, []).append(int(sampler.system_ids[k]))
        raise CLIError("data.structures", one_line(unsupported_elements(model, found)))
    if full:
        try:
            sampler.bind(model.cutoff + model.neighbors.skin)
        except Exception as exc:
            key = "data.sampler" if "max_" in str(exc) else "data.structures"
            raise CLIError(key, one_line(str(exc))) from exc
    _check_transfer_buffer(built)
    return {
        "systems": len(sampler),
        "atoms": int(sampler.sizes.sum()),
        "elements": " ".join(chemical_symbols[z] for z in sorted(sampler.elements)),
    }


def _check_transfer_buffer(built: Built) -> None:
    """Pipelines/replicas: every system must fit the transfer buffer (checked before any
    rank starts, so the error names the config key rather than failing in a launch)."""
    from ..strategies.distributed import DistributedStrategy

    strategy = built.sim.strategy
    if not isinstance(strategy, DistributedStrategy):
        return
    sampler = built.source
    try:
        strategy.validate(sampler, built.sim.model.cutoff + built.sim.model.neighbors.skin)
    except Exception as exc:
        text = str(exc)
        key = next(
            (f"simulator.buffer.{f}" for f in ("num_atoms", "num_edges") if f in text),
            "simulator",
        )
        raise CLIError(key, one_line(text)) from exc
