"""The merged config checked and normalised before jsonargparse parses it.

Plugin entries are resolved to import paths (:mod:`.names`); required keys, closed
choices, dataclass sections and non-finite numbers are checked here so each error
names its key; output paths are made absolute so the saved config writes to the same
place from any working directory.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import os
import re
import typing
from pathlib import Path
from typing import Any

from .config import BUILTIN_PREFIX
from .errors import CLIError, one_line
from .names import COMPONENTS, import_class, resolve_component, resolve_nested
from .sections import DataConfig, OutputConfig, SamplerConfig

_SAMPLER_BASE = "alchemi_lit.data.sampler.SizeAwareSampler"


def check_config(conf: dict[str, Any]) -> dict[str, Any]:
    """``conf`` (the merged config) with its plugins resolved, checked section by section."""
    sim = conf.get("simulator")
    if sim is None:
        sim = conf["simulator"] = {}
    if not isinstance(sim, dict):
        raise CLIError("simulator", f"expected a mapping of Simulator arguments, got {sim!r}")
    known = _simulator_params()
    for k in sim:
        if k not in known:
            close = difflib.get_close_matches(str(k), known, n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            raise CLIError(
                f"simulator.{k}", f"unknown Simulator argument.{hint} Arguments: {', '.join(known)}"
            )
    if sim.get("model") is None:
        raise CLIError(
            "simulator.model",
            "missing: give a model, e.g. `model: {class_path: lj-argon}` or `class_path: EMT` "
            "(`alchemi-lit plugins --kind model` lists them)",
        )
    if sim.get("stages") in (None, [], ""):
        raise CLIError(
            "simulator.stages",
            "missing: give one integrator or a list of them, e.g. `- class_path: FIRE`",
        )
    if isinstance(sim.get("precision"), int):
        sim["precision"] = str(sim["precision"])  # `precision: 64` written without quotes
    for name, (kind, base, is_list) in COMPONENTS.items():
        if sim.get(name) is None:
            continue
        value = sim[name]
        key = f"simulator.{name}"
        if is_list and name != "stages" and not isinstance(value, list):
            raise CLIError(
                key,
                f"expected a list of {kind}s, e.g. `{name}: [{{class_path: NAME}}]`, got {value!r}",
            )
        if is_list and isinstance(value, list):
            sim[name] = [
                _resolve_list_item(v, f"{key}.{i}", kind, base) for i, v in enumerate(value)
            ]
        else:
            sim[name] = resolve_component(value, key, kind, base)
    _check_strategy(sim)
    for k in sim:
        if k not in COMPONENTS and k != "strategy":
            sim[k] = resolve_nested(sim[k], f"simulator.{k}")
    _check_dataclass_args(sim)
    _check_data(conf)
    if conf.get("output") is None:
        conf.pop("output", None)
    _check_keys(conf.get("output"), OutputConfig, "output")
    _absolute_output_paths(conf)
    _check_finite(conf, "")
    return conf


def _simulator_params() -> list[str]:
    from ..simulator import Simulator

    return [n for n in inspect.signature(Simulator.__init__).parameters if n != "self"]


def _resolve_list_item(value: Any, key: str, kind: str, base: str) -> Any:
    if isinstance(value, list):  # [[a, b], [c]]: a pipeline, one inner list per rank
        return [_resolve_list_item(v, f"{key}.{i}", kind, base) for i, v in enumerate(value)]
    return resolve_component(value, key, kind, base)


def _absolute_output_paths(conf: dict[str, Any]) -> None:
    """Where sinks and callbacks write (a store, a trajectory, checkpoints; parameters
    typed as paths) and ``output.dir``, made absolute against the working directory, as
    the structure paths are: the saved config then writes to the same place when it
    re-runs from any directory.  Defaults (``Checkpoint``'s ``checkpoints``) included."""
    sim = conf["simulator"]
    for name in ("sinks", "callbacks"):
        for item in sim.get(name) or []:
            if not isinstance(item, dict) or "class_path" not in item:
                continue
            cls = import_class(item["class_path"], f"simulator.{name}")
            try:
                params = inspect.signature(cls).parameters.values()
            except (TypeError, ValueError):  # nothing to read: left as written
                continue
            init = item.setdefault("init_args", {})
            for p in params:
                if not re.search(r"\b(PathLike|Path)\b", str(p.annotation)):
                    continue
                value = init.get(p.name, None if p.default is p.empty else p.default)
                if isinstance(value, (str, os.PathLike)) and str(value) and "://" not in str(value):
                    init[p.name] = os.path.abspath(Path(value).expanduser())  # not URLs
    output = conf.get("output")
    if isinstance(output, dict) and isinstance(output.get("dir"), str) and output["dir"]:
        output["dir"] = os.path.abspath(Path(output["dir"]).expanduser())


def _check_strategy(sim: dict[str, Any]) -> None:
    """``simulator.strategy``: ``auto`` or a registered name (a closed set: anything else
    is an error listing the valid names), or a registered class as class_path/init_args."""
    from ..core.errors import ConfigError
    from ..strategies.base import check_strategy_name

    value = sim.get("strategy")
    if value is None:
        return
    key = "simulator.strategy"
    if isinstance(value, dict):
        sim["strategy"] = resolve_component(
            value, key, "strategy", "alchemi_lit.strategies.base.Strategy"
        )
        return
    if not isinstance(value, str):
        raise CLIError(key, f"expected a strategy name (auto, single, pipeline ...), got {value!r}")
    try:
        check_strategy_name(value)
    except ConfigError as exc:
        raise CLIError(key, one_line(str(exc))) from None


def dataclass_params(cls: type) -> dict[str, type]:
    """Parameters of ``cls.__init__`` annotated with a dataclass (or ``X | None``)."""
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:
        return {}
    out = {}
    for name, hint in hints.items():
        for arg in (hint, *typing.get_args(hint)):
            if isinstance(arg, type) and dataclasses.is_dataclass(arg):
                out[name] = arg
                break
    return out


def _check_dataclass_args(sim: dict[str, Any]) -> None:
    """Simulator arguments that are dataclasses (``buffer: BufferConfig``) given as a
    mapping: a clear error for anything else and for unknown keys."""
    from ..simulator import Simulator

    for name, cls in dataclass_params(Simulator).items():
        value = sim.get(name)
        if value is None or (isinstance(value, dict) and "class_path" in value):
            continue
        known = _dataclass_keys(cls)
        if not isinstance(value, dict):
            raise CLIError(
                f"simulator.{name}",
                f"expected a mapping with keys {', '.join(known)} ({cls.__name__}), got {value!r}",
            )
        _check_keys(value, cls, f"simulator.{name}")


def _check_finite(value: Any, key: str) -> None:
    """NaN or infinity anywhere in the config (YAML ``.nan``, ``.inf``): an error naming the key."""
    if isinstance(value, float) and not math.isfinite(value):
        raise CLIError(key or "config", f"expected a finite number, got {value}")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(v, f"{key}.{i}" if key else str(i))


def _dataclass_keys(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _check_keys(section: Any, cls: type, key: str) -> None:
    if section is None:
        return
    if not isinstance(section, dict):
        raise CLIError(key, f"expected a mapping, got {section!r}")
    known = _dataclass_keys(cls)
    for k in section:
        if k not in known:
            close = difflib.get_close_matches(str(k), known, n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            raise CLIError(f"{key}.{k}", f"unknown key.{hint} Keys: {', '.join(known)}")


def _check_data(conf: dict[str, Any]) -> None:
    data = conf.get("data")
    if data is None or (isinstance(data, dict) and not data.get("structures")):
        raise CLIError(
            "data.structures",
            "missing: give a structure file (any format ASE reads) or "
            "builtin:argon / builtin:mixed_argon",
        )
    _check_keys(data, DataConfig, "data")
    if not isinstance(data["structures"], str):
        raise CLIError(
            "data.structures", f"expected a file path or builtin:NAME, got {data['structures']!r}"
        )
    if data.get("builtin_args") is None:
        data.pop("builtin_args", None)
    elif not isinstance(data["builtin_args"], dict):
        raise CLIError(
            "data.builtin_args",
            f"expected a mapping of keyword arguments, got {data['builtin_args']!r}",
        )
    _check_sampler(data)
    if data.get("shard") is not None:
        from ..data.datasets import parse_shard

        try:
            parse_shard(data["shard"])
        except Exception as exc:
            raise CLIError("data.shard", str(exc)) from exc
    structures = data["structures"]
    if not structures.startswith(BUILTIN_PREFIX) and Path(structures).expanduser().exists():
        # absolute, so that the saved config re-runs from any working directory
        data["structures"] = os.path.abspath(Path(structures).expanduser())


def _check_sampler(data: dict[str, Any]) -> None:
    """``data.sampler``: budgets for SizeAwareSampler (a mapping) or a registered sampler
    (``class_path``: a SizeAwareSampler subclass; the CLI passes the structures as its
    first argument, ``dataset``)."""
    from ..data import SizeAwareSampler
    from .names import check_init_args

    spec = data.get("sampler")
    if spec is None:
        return
    if isinstance(spec, str):
        spec = {"class_path": spec}
    if not isinstance(spec, dict):
        raise CLIError(
            "data.sampler",
            f"expected budgets as a mapping (e.g. {{max_atoms: 20000, max_systems: 512}}) or a "
            f"registered sampler ({{class_path: NAME, init_args: {{...}}}}), got {spec!r}",
        )
    if "class_path" in spec:
        data["sampler"] = resolve_component(
            spec, "data.sampler", "sampler", _SAMPLER_BASE, given=("dataset", "shard")
        )
        return
    _check_keys(spec, SamplerConfig, "data.sampler")
    if spec.get("max_atoms") is None:
        raise CLIError("data.sampler.max_atoms", "required: the most atoms in flight at once")
    check_init_args(SizeAwareSampler, spec, "data.sampler", given=("dataset", "shard"))
