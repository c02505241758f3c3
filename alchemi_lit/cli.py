"""``alchemi-lit``: run, validate and inspect simulations from YAML configs.

Commands::

    alchemi-lit run --config configs/quickstart.yaml
    alchemi-lit run --config x.yaml --simulator.stages.1.init_args.temperature 500
    alchemi-lit run --config x.yaml --print_config          # resolved config, re-runnable
    alchemi-lit validate --config x.yaml                     # build and check all, run nothing
    alchemi-lit run --simulator.model.help LennardJones      # parameters of one class
    alchemi-lit plugins [--kind integrator]                  # every registered plugin
    alchemi-lit report results.zarr [--plots DIR] [--trajectory traj.zarr]

A config has three sections, as in LightningCLI::

    simulator:   # the arguments of alchemi_lit.Simulator; plugins as class_path/init_args
      model: {class_path: lj-argon}
      stages:                       # a list is a fused plan: FIRE + Langevin
        - {class_path: FIRE, init_args: {fmax: 0.05}}
        - {class_path: Langevin, init_args: {temperature: 60, steps: 200}}
      sinks: [{class_path: ZarrSink, init_args: {store: results/x.zarr, mode: w}}]
    data:        # what to run
      structures: builtin:argon     # or any file ASE reads (relative to the config file)
      builtin_args: {n_systems: 32}
      sampler: {max_atoms: 20000}   # optional: inflight batching within these budgets
    output:      # optional: where <name>.config.yaml and <name>.summary.json go
      dir: results

How a command line becomes a run, and why it is built this way:

1. Plugins are loaded first (built-ins and ``alchemi_lit.plugins`` entry points).
2. The YAML files and the ``--key value`` overrides are merged *here*, into one plain
   dict: jsonargparse cannot address list items by index
   (``--simulator.stages.1.init_args.temperature``) and knows neither presets
   (``fire-ase`` = ``FIRE(mode="ase")``) nor plugin aliases.  Registered names in
   ``class_path`` are replaced by import paths, preset arguments become defaults
   under ``init_args``.
3. Each plugin's ``init_args`` are type-checked against its own signature (a small
   jsonargparse parser per class), so an error names the exact key
   (``simulator.stages.0.init_args.fmax: expected float, got 'abc'``) instead of
   jsonargparse's union-of-everything report.
4. jsonargparse then parses the merged config (types, defaults, ``--print_config``,
   per-class ``--X.help``); the resolved config is its dump.
5. Objects are instantiated one by one, so a constructor's ``ValueError`` is reported
   under the key of the object that raised it.

Every user error ends as ONE line on stderr naming the key, exit status 2; ``--debug``
adds the traceback.  Lightning Fabric is never imported here (single-device runs do
not need it and it costs seconds to import).
"""

from __future__ import annotations

import copy
import difflib
import inspect
import json
import os
import re
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

EXIT_USAGE = 2
COMMANDS = {
    "run": "run a config: relax / simulate every structure, write the sinks, print a summary",
    "validate": "build and check a config (model, plan, sinks, structures); run nothing",
    "plugins": "list every registered plugin (integrators, models, callbacks, sinks, ...)",
    "report": "summarize a results store and (with --plots) plot it",
}
SECTIONS = ("simulator", "data", "output")
BUILTIN_PREFIX = "builtin:"


class CLIError(Exception):
    """A user error: printed as one line naming ``key``, exit status 2."""

    def __init__(self, key: str | None, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}" if key else message)


# ---------------------------------------------------------------------- config sections
@dataclass
class SamplerConfig:
    """Inflight batching budgets: the shorthand ``sampler: {max_atoms: ...}`` for
    :class:`~alchemi_lit.data.SizeAwareSampler` with these arguments.

    Args:
        max_atoms: most atoms in flight at once, or ``auto``: measured on the run's
            device (a fit of the model's memory on small probe batches).
        max_systems: most systems in flight at once (None: no limit).
        max_edges: most neighbour pairs in flight (None: no limit).
        skip_invalid: leave invalid structures out with a warning instead of failing.
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
        first_id: number the structures' ``system_id`` from this value on (default:
            from 0, or the ids results of an earlier run carry), e.g. to append them to
            a results store that holds ids from 0 on.
        sampler: inflight batching: budgets for the built-in SizeAwareSampler
            (``{max_atoms: 20000, max_systems: 512, max_edges: null, skip_invalid: false}``)
            or a registered sampler (``{class_path: NAME, init_args: {...}}``, see
            ``alchemi-lit plugins --kind sampler``); without it all structures run as one
            batch.
    """

    structures: str
    builtin_args: dict[str, Any] = field(default_factory=dict)
    format: str | None = None
    index: str | int = ":"
    first_id: int | None = None
    sampler: dict[str, Any] | None = None


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


# ---------------------------------------------------------------------- entry point
def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    try:
        with warnings.catch_warnings():  # restores showwarning when main returns
            warnings.showwarning = _log_warning
            return _dispatch(args)
    except SystemExit as exc:  # --help, --print_config, argparse
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else EXIT_USAGE)
    except KeyboardInterrupt as exc:  # RunInterrupted says where the results are
        print(f"{str(exc) or 'interrupted'}; continue the run with --resume", file=sys.stderr)
        return 128 + int(getattr(exc, "signum", 2))
    except Exception as exc:
        code, message = _classify(exc)
        if debug:
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        print(f"error: {message}", file=sys.stderr)
        if code != EXIT_USAGE and not debug:
            print("(run again with --debug for the traceback)", file=sys.stderr)
        return code


def _log_warning(
    message: Warning | str, category: type[Warning], *_args: Any, **_kwargs: Any
) -> None:
    """Python warnings (a StructureWarning about close atoms ...) go to the run's log,
    one line each, like everything else the CLI reports."""
    from loguru import logger

    logger.warning(f"{category.__name__}: {message}")


def _classify(exc: BaseException) -> tuple[int, str]:
    """Exit status and one-line message for an exception."""
    from .errors import AlchemiError

    if isinstance(exc, CLIError):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, (AlchemiError, ValueError, FileNotFoundError, FileExistsError)):
        return EXIT_USAGE, _one_line(str(exc))
    from argparse import ArgumentError  # what jsonargparse raises

    if isinstance(exc, ArgumentError):
        return EXIT_USAGE, _explain_jsonargparse(str(exc), "")
    return 1, f"unexpected {type(exc).__name__}: {_one_line(str(exc))}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _top_help() -> str:
    lines = [
        "usage: alchemi-lit [--debug] {run,validate,plugins,report} ...",
        "",
        "Relax and simulate thousands of atomic structures at once.",
        "",
        "commands:",
        *(f"  {name:<9} {text}" for name, text in COMMANDS.items()),
        "",
        "options:",
        "  -h, --help  show this help and exit (also: alchemi-lit COMMAND --help)",
        "  --version   print the version and exit",
        "  --debug     show tracebacks of errors",
        "",
        "examples:",
        "  alchemi-lit run --config configs/quickstart.yaml",
        "  alchemi-lit run --config configs/quickstart.yaml \\",
        "      --simulator.stages.1.init_args.temperature 500",
        "  alchemi-lit run --config configs/quickstart.yaml --print_config > my.yaml",
        "  alchemi-lit validate --config my.yaml",
        "  alchemi-lit run --simulator.stages.help FIRE",
        "  alchemi-lit report results/quickstart.zarr --plots results/plots",
    ]
    return "\n".join(lines)


def _dispatch(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(_top_help())
        return 0 if args else EXIT_USAGE
    if args[0] == "--version":
        from . import __version__

        print(f"alchemi-lit {__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f" Did you mean {close[0]}?" if close else ""
        raise CLIError(None, f"unknown command {command!r}.{hint} Commands: {', '.join(COMMANDS)}")
    if command in ("run", "validate"):
        return _run_or_validate(command, rest)
    if command == "plugins":
        return _plugins(rest)
    return _report(rest)


# ---------------------------------------------------------------------- argv -> config dict
@dataclass
class _Request:
    configs: list[str] = field(default_factory=list)
    overrides: list[tuple[str, str, bool]] = field(default_factory=list)  # key, raw value, append
    passthrough: list[str] = field(default_factory=list)  # handled by jsonargparse
    resume: str | bool | None = None  # --resume [PATH]
    help: tuple[str, str | None] | None = None  # --KEY.help [NAME]: (KEY, NAME)


def _split_argv(args: list[str]) -> _Request:
    req = _Request()
    i = 0
    while i < len(args):
        tok = args[i]
        if tok in ("-h", "--help") or tok == "--print_config" or tok.startswith("--print_config="):
            req.passthrough.append(tok)
            i += 1
            continue
        if not tok.startswith("--"):
            raise CLIError(
                None, f"unexpected argument {tok!r}; options look like --simulator.seed 1"
            )
        name, eq, value = tok[2:].partition("=")
        if name == "resume":  # --resume [PATH]: the Checkpoint directory by default
            if eq:
                req.resume = value
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                req.resume, i = args[i + 1], i + 1
            else:
                req.resume = True
            i += 1
            continue
        if not eq:
            if name.endswith(".help") and (i + 1 >= len(args) or args[i + 1].startswith("--")):
                req.passthrough.append(tok)  # --simulator.model.help (no class): list them
                req.help = (name[: -len(".help")], None)
                i += 1
                continue
            if i + 1 >= len(args):
                raise CLIError(name.rstrip("+"), "expected a value after the option")
            value = args[i + 1]
            i += 2
        else:
            i += 1
        if name == "config":
            req.configs.append(value)
        elif name.endswith(".help"):
            req.passthrough.append(f"--{name}={_help_target(value)}")
            req.help = (name[: -len(".help")], value)
        elif name.endswith("+"):
            req.overrides.append((name[:-1], value, True))
        else:
            req.overrides.append((name, value, False))
    return req


def _help_target(value: str) -> str:
    from . import registry

    entry = registry.find(value) if "." not in value else None
    return entry.import_path if entry is not None else value


#: option keys holding plugins -> registry kind (``--KEY.help [NAME]``)
_HELP_KINDS = {
    "simulator.model": "model",
    "simulator.stages": "integrator",
    "simulator.callbacks": "callback",
    "simulator.sinks": "sink",
    "simulator.strategy": "strategy",
    "data.sampler": "sampler",
}


def _help_kind(key: str) -> str | None:
    """The plugin kind an option key holds: ``simulator.stages.0`` -> integrator,
    ``...init_args.criterion`` -> criterion."""
    parts = [p for p in key.split(".") if p and not _is_index(p) and p != "init_args"]
    if parts and parts[-1] == "criterion":
        return "criterion"
    return _HELP_KINDS.get(".".join(parts))


def _class_help(command: str, key: str, name: str | None) -> int | None:
    """``--KEY.help NAME``: the parameters of one plugin, with a preset's bound values as
    the defaults; ``--KEY.help`` alone: the registered plugins that fit KEY.  None when
    KEY holds no plugin (jsonargparse answers then)."""
    from jsonargparse import ArgumentParser
    from rich.console import Console

    from . import registry
    from .help_format import ReadableDefaults

    kind = _help_kind(key)
    option = f"--{key}.help"
    if name is None:
        if kind is None:
            return None
        table = _plugin_table(kind, f"{option} NAME: {_plural(kind)}")
        Console(width=_width() and 200).print(table)
        print(f"parameters of one: alchemi-lit {command} {option} NAME")
        return 0
    path, preset = _lookup(name, option, kind)
    cls = _import_class(path, option)
    entry = registry.find(name) if "." not in name else None
    given = ("dataset",) if kind == "sampler" else ()
    if preset:
        bound = ", ".join(f"{k}={v!r}" for k, v in preset.items())
        description = (
            f"{name}: preset of {path} binding {bound} (shown as the defaults below). "
            f"Use it as `class_path: {name}`; any parameter can be changed under init_args."
        )
    else:
        source = f" from package {entry.source}" if entry is not None else ""
        description = f"{path}{source}; use it as `class_path: {entry.name if entry else path}`."
    parser = ArgumentParser(
        prog=f"alchemi-lit {command} {option} {name}",
        description=description,
        exit_on_error=False,
        formatter_class=ReadableDefaults,  # "≈1.018 fs", not 1.0180505671156725
    )
    nested = f"{key}.init_args"
    parser.add_class_arguments(cls, nested, fail_untyped=False, skip=set(given))
    if preset:
        parser.set_defaults({f"{nested}.{k}": v for k, v in preset.items()})
    parser.print_help()
    return 0


def _parse_value(raw: str) -> Any:
    """A command-line value as YAML (numbers, booleans, null, lists, dicts); else the string."""
    import yaml

    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def _load_yaml(path: str) -> dict[str, Any]:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise CLIError(
            "--config",
            f"file {path!r} does not exist" if not p.exists() else f"{path!r} is not a file",
        )
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise CLIError(
            "--config", f"{path}: invalid YAML{where}: {_one_line(str(problem))}"
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise CLIError(
            "--config", f"{path}: expected a mapping with sections {', '.join(SECTIONS)}"
        )
    _check_sections(data, f"--config {path}")
    structures = (
        (data.get("data") or {}).get("structures") if isinstance(data.get("data"), dict) else None
    )
    if isinstance(structures, str) and structures and not structures.startswith(BUILTIN_PREFIX):
        data["data"]["structures"] = _resolve_relative(structures, p.parent)
    return data


def _load_yaml_section(path: str, section: str) -> dict[str, Any]:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise CLIError(
            section, f"expected a mapping or a YAML file holding one; {path!r} is neither"
        )
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise CLIError(section, f"{path}: invalid YAML: {_one_line(str(exc))}") from None
    if not isinstance(data, dict):
        raise CLIError(section, f"{path}: expected a mapping")
    structures = data.get("structures") if section == "data" else None
    if isinstance(structures, str) and structures and not structures.startswith(BUILTIN_PREFIX):
        data["structures"] = _resolve_relative(structures, p.parent)
    return data


def _check_sections(data: dict[str, Any], where: str) -> None:
    for key in data:
        if key not in SECTIONS:
            close = difflib.get_close_matches(str(key), SECTIONS, n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            raise CLIError(
                str(key), f"unknown section in {where}.{hint} Sections: {', '.join(SECTIONS)}"
            )


def _resolve_relative(path: str, base: Path) -> str:
    """A path written in a config file: next to the config if it exists there, else as given."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return str(p)
    candidate = base / p
    if candidate.exists():
        try:
            return os.path.relpath(candidate)
        except ValueError:  # other drive (Windows)
            return str(candidate.resolve())
    return path


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge, everything else (lists included) is replaced."""
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


_COMPONENT_META = ("class_path", "init_args", "dict_kwargs")


def _apply_override(conf: dict[str, Any], key: str, raw: str, append: bool) -> None:
    """Set ``key`` (dotted, list items by index) in ``conf``, like jsonargparse would."""
    parts = [p for p in key.split(".") if p]
    if not parts or parts[0] not in SECTIONS:
        close = difflib.get_close_matches(parts[0] if parts else key, SECTIONS, n=1)
        hint = f" Did you mean --{close[0]}...?" if close else ""
        raise CLIError(
            key, f"unknown option.{hint} Options start with --simulator., --data. or --output."
        )
    value = _parse_value(raw)
    if len(parts) == 1 and isinstance(value, str) and not append:
        # --simulator sim.yaml: a file holding just that section (as in jsonargparse)
        section = _load_yaml_section(value, parts[0])
        conf[parts[0]] = _merge(conf.get(parts[0]) or {}, section)
        return
    node: Any = conf
    walked: list[str] = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        here = ".".join([*walked, part])
        if isinstance(node, list):
            if _is_index(part):
                idx = int(part)
                if not -len(node) <= idx < len(node):
                    raise CLIError(
                        here, f"index {idx} out of range: the list has {len(node)} item(s)"
                    )
                if last:
                    node[idx] = _appended(node[idx], value) if append else value
                    return
                if node[idx] is None or isinstance(node[idx], str):
                    node[idx] = {"class_path": node[idx]} if isinstance(node[idx], str) else {}
                node = node[idx]
                walked.append(part)
                continue
            if not node:
                raise CLIError(here, "the list is empty; add an item first (--key+=NAME)")
            if isinstance(node[-1], str):  # a bare name: make it a component
                node[-1] = {"class_path": node[-1]}
            node = node[-1]  # jsonargparse: --stages.init_args.x changes the last item
        if not isinstance(node, dict):
            raise CLIError(
                ".".join(walked), f"is {type(node).__name__} {node!r}, cannot set {part!r} in it"
            )
        if "class_path" in node and part not in _COMPONENT_META:
            init = node.get("init_args")
            if not isinstance(init, dict):
                init = node["init_args"] = {}
            node = init
        if last:
            if part == "class_path" and "class_path" in node and not append:
                _change_class(node, value, here)
            elif append:
                node[part] = _appended(node.get(part), value)
            else:
                node[part] = value
            return
        child = node.get(part)
        if child is None or (isinstance(child, str) and not _is_index(parts[i + 1])):
            child = (
                {"class_path": child}
                if isinstance(child, str)
                else ([] if _is_index(parts[i + 1]) else {})
            )
            node[part] = child
        node = child
        walked.append(part)


def _is_index(part: str) -> bool:
    return bool(re.fullmatch(r"-?\d+", part))


def _appended(current: Any, value: Any) -> list[Any]:
    if current is None:
        return [value]
    if isinstance(current, list):
        return [*current, value]
    return [current, value]  # a single component becomes a list of two


def _change_class(node: dict[str, Any], name: Any, key: str) -> None:
    """``--x.class_path NEW``: keep the init_args the new class accepts (jsonargparse does too)."""
    node["class_path"] = name
    init = node.get("init_args")
    if not isinstance(init, dict) or not isinstance(name, str):
        return
    path, preset = _lookup(name, key, None)
    cls = _import_class(path, key)
    params = _init_params(cls)
    if params is not None:
        node["init_args"] = {k: v for k, v in init.items() if k in params}
    node["class_path"] = path
    node["init_args"] = {**preset, **node.get("init_args", {})}


# ---------------------------------------------------------------------- plugin names
#: Simulator arguments holding plugins: registry kind, base class (import path), is a list
_COMPONENTS = {
    "model": ("model", "alchemi_lit.models.base.Model", False),
    "stages": ("integrator", "alchemi_lit.integrators.base.Integrator", True),
    "callbacks": ("callback", "alchemi_lit.hooks.Callback", True),
    "sinks": ("sink", "alchemi_lit.sinks.Sink", True),
}


def _lookup(name: str, key: str, kind: str | None) -> tuple[str, dict[str, Any]]:
    """A ``class_path`` value -> (import path, preset args).  Dotted paths pass through."""
    from . import registry
    from .errors import ConfigError

    if "." in name:
        return name, {}
    if kind is not None:
        if name.lower() in registry.REGISTRIES[kind]:
            entry = registry.get(kind, name)
            return entry.import_path, dict(entry.preset_args)
        other = registry.find(name)
        if other is not None:
            raise CLIError(
                key,
                f"{name!r} is a registered {other.kind}, not {_a(kind)}; "
                f"`alchemi-lit plugins --kind {kind}` lists the {_plural(kind)}",
            )
        try:
            registry.get(kind, name)  # raises with the close matches of this kind
        except ConfigError as exc:
            raise CLIError(key, str(exc)) from None
    entry = registry.find(name)
    if entry is None:
        raise CLIError(key, str(registry.unknown_name_error(name)))
    return entry.import_path, dict(entry.preset_args)


def _plural(kind: str) -> str:
    return {"strategy": "strategies", "criterion": "criteria"}.get(kind, f"{kind}s")


def _a(noun: str) -> str:
    """``noun`` with its indefinite article: "an integrator", "a model"."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _import_class(path: str, key: str) -> type:
    import importlib

    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise CLIError(
            key, f"{path!r} is neither a registered plugin name nor an import path (module.Class)"
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except (ImportError, TypeError, ValueError) as exc:  # TypeError: relative ("..x")
        # perhaps a nested attribute (module.Class.Inner)
        head, _, inner = module_name.rpartition(".")
        try:
            obj = getattr(importlib.import_module(head), inner)
        except Exception:
            raise CLIError(
                key,
                f"cannot import {path!r} ({type(exc).__name__}: {exc}); give a registered plugin "
                f"name or a full import path (package.module.Class)",
            ) from None
    try:
        cls = getattr(obj, attr)
    except AttributeError:
        raise CLIError(
            key, f"cannot import {path!r}: {module_name!r} has no attribute {attr!r}"
        ) from None
    if not isinstance(cls, type):
        raise CLIError(key, f"{path!r} is not a class")
    return cls


def _init_params(cls: type) -> set[str] | None:
    """Names ``cls(...)`` accepts; None if it takes ``**kwargs``."""
    try:
        sig = inspect.signature(cls.__init__)
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return {
        n
        for n, p in sig.parameters.items()
        if n != "self" and p.kind is not inspect.Parameter.VAR_POSITIONAL
    }


def _resolve_component(
    value: Any, key: str, kind: str | None, base_path: str | None, given: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Normalise one plugin entry to ``{class_path: import.path, init_args: {...}}``.
    ``given``: constructor parameters the CLI passes itself (a sampler's ``dataset``)."""
    if isinstance(value, str):
        value = {"class_path": value}
    if not isinstance(value, dict):
        what = _a(kind) if kind else "a plugin"
        raise CLIError(key, f"expected {what} as class_path/init_args, got {value!r}")
    if "class_path" not in value or value["class_path"] in (None, ""):
        hint = (
            f" (a registered {kind} name or an import path; "
            f"see `alchemi-lit plugins --kind {kind}`)"
            if kind
            else ""
        )
        raise CLIError(f"{key}.class_path", f"missing{hint}")
    name = value["class_path"]
    if not isinstance(name, str):
        raise CLIError(f"{key}.class_path", f"expected a name or import path, got {name!r}")
    init = value.get("init_args") or {}
    if not isinstance(init, dict):
        raise CLIError(f"{key}.init_args", f"expected a mapping of parameters, got {init!r}")
    extra = {k: v for k, v in value.items() if k not in _COMPONENT_META}
    init = {**init, **extra}  # parameters written next to class_path
    path, preset = _lookup(name, f"{key}.class_path", kind)
    cls = _import_class(path, f"{key}.class_path")
    if base_path is not None:
        base = _import_class(base_path, key)
        if not issubclass(cls, base):
            raise CLIError(
                f"{key}.class_path",
                f"{cls.__name__} is not {_a(kind or 'plugin')} (not a subclass of {base.__name__})",
            )
    init = {**preset, **init}
    init = {k: _resolve_nested(v, f"{key}.init_args.{k}") for k, v in init.items()}
    _check_init_args(cls, init, f"{key}.init_args", given)
    out: dict[str, Any] = {"class_path": path, "init_args": init}
    if value.get("dict_kwargs") is not None and not isinstance(value["dict_kwargs"], dict):
        raise CLIError(
            f"{key}.dict_kwargs",
            f"expected a mapping of keyword arguments, got {value['dict_kwargs']!r}",
        )
    if value.get("dict_kwargs"):
        out["dict_kwargs"] = value["dict_kwargs"]
    return out


def _resolve_nested(value: Any, key: str) -> Any:
    """Resolve registered names of plugins nested anywhere (criteria, sub-objects)."""
    if isinstance(value, dict):
        if isinstance(value.get("class_path"), str):
            return _resolve_component(value, key, None, None)
        return {k: _resolve_nested(v, f"{key}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_nested(v, f"{key}.{i}") for i, v in enumerate(value)]
    return value


def _check_init_args(
    cls: type, init: dict[str, Any], key: str, given: tuple[str, ...] = ()
) -> None:
    """Type-check ``init`` against the signature of ``cls`` (one jsonargparse parser per
    class).  ``given``: parameters the CLI passes itself, not accepted from the config."""
    from jsonargparse import ArgumentError, ArgumentParser

    for name in given:
        if name in init:
            raise CLIError(
                f"{key}.{name}",
                "set by alchemi-lit itself (the structures of data.structures); remove it",
            )
    params = _init_params(cls)
    if params is not None:
        params -= set(given)
        for name in init:
            if name not in params:
                close = difflib.get_close_matches(str(name), sorted(params), n=2)
                hint = f" Did you mean {', '.join(close)}?" if close else ""
                raise CLIError(
                    f"{key}.{name}",
                    f"{cls.__name__} has no parameter {name!r}.{hint} "
                    f"Parameters: {', '.join(sorted(params)) or 'none'}",
                )
    parser = ArgumentParser(exit_on_error=False)
    try:
        parser.add_class_arguments(cls, fail_untyped=False, skip=set(given))
    except Exception:  # a signature jsonargparse cannot describe: leave it to the constructor
        return
    try:
        parser.parse_object(copy.deepcopy(init))  # it converts nested dicts in place
    except ArgumentError as exc:
        raise CLIError(None, _explain_jsonargparse(str(exc), key, cls.__name__)) from None


def _explain_jsonargparse(msg: str, prefix: str, owner: str | None = None) -> str:
    """One line out of a jsonargparse error message, naming the full key."""

    def full(k: str) -> str:
        return f"{prefix}.{k}" if prefix else k

    text = msg.strip()
    m = re.match(r"Option '([^']+)' is not accepted", text)
    if m:
        return f"{full(m.group(1))}: unknown parameter" + (f" of {owner}" if owner else "")
    m = re.match(r"the following arguments are required: (.+)", text)
    if m:
        keys = [k.strip() for k in m.group(1).split(",")]
        return f"{full(keys[0])}: required" + (f" by {owner}" if owner else "") + " but not given"
    m = re.search(r'Key "([^"]+)" is required', text)
    if m:
        return f"{full(m.group(1))}: required but not given"
    keys = re.findall(r'(?:Parser key|Key) "([^"]+)"', text)
    key = full(keys[0]) if keys else (prefix or "config")
    expected = re.search(r"Expected a (.+?)\. Got value: (.*)", text)
    if expected:
        return f"{key}: expected {_type_name(expected.group(1))}, got {expected.group(2).strip()!r}"
    union = re.search(r"Subtypes: \[(.*?)\]", text)
    given = re.search(r"Given value: (.*)", text)
    if "Does not validate against any of the Union subtypes" in text and union and given:
        names = [_type_name(t.strip()) for t in re.findall(r"<class '[\w.]+'>", union.group(1))]
        names = ["null" if n == "NoneType" else n for n in names]
        return f"{key}: expected {' or '.join(names)}, got {given.group(1).strip()}"
    skip = (
        "Subtypes:",
        "Errors:",
        "Given value",
        "Does not validate against any",
        "Subclass types expect",
        "- a class path",
        "- a dict",
        "Not a valid subclass",
        "- Expected a <class 'NoneType'>",
        "Parser key",
        'Key "',
    )
    detail = [
        ln.strip(" -") for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(skip)
    ]
    detail = [d for d in detail if not d.startswith(skip)]
    body = "; ".join(dict.fromkeys(detail)) or _one_line(text)
    return f"{key}: {body[:400]}"


def _type_name(text: str) -> str:
    text = re.sub(r"<class '([\w.]+)'>", lambda m: m.group(1).rsplit(".", 1)[-1], text)
    m = re.fullmatch(r"typing\.Literal\[(.*)\]", text)
    if m:
        return f"one of {m.group(1)}"
    return text.replace("typing.", "").replace("collections.abc.", "")


# ---------------------------------------------------------------------- config assembly
def _help_only(req: _Request) -> bool:
    return any(t in ("-h", "--help") or t.split("=")[0].endswith(".help") for t in req.passthrough)


def _simulator_params() -> list[str]:
    from .simulator import Simulator

    return [n for n in inspect.signature(Simulator.__init__).parameters if n != "self"]


def _assemble(req: _Request) -> dict[str, Any]:
    """Merged, name-resolved and pre-checked config dict (see module docstring)."""
    from . import registry

    registry.all_entries()  # entry-point plugins register before any name is looked up
    conf: dict[str, Any] = {}
    for path in req.configs:
        conf = _merge(conf, _load_yaml(path))
    for key, raw, append in req.overrides:
        _apply_override(conf, key, raw, append)
    if _help_only(req):
        return conf
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
    for name, (kind, base, is_list) in _COMPONENTS.items():
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
            sim[name] = _resolve_component(value, key, kind, base)
    _check_strategy(sim)
    for k in sim:
        if k not in _COMPONENTS and k != "strategy":
            sim[k] = _resolve_nested(sim[k], f"simulator.{k}")
    _check_dataclass_args(sim)
    _check_data(conf)
    _check_output(conf)
    _absolute_output_paths(conf)
    _check_finite(conf, "")
    return conf


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
            cls = _import_class(item["class_path"], f"simulator.{name}")
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
    from .errors import ConfigError
    from .strategies.base import check_strategy_name

    value = sim.get("strategy")
    if value is None:
        return
    key = "simulator.strategy"
    if isinstance(value, dict):
        sim["strategy"] = _resolve_component(
            value, key, "strategy", "alchemi_lit.strategies.base.Strategy"
        )
        return
    if not isinstance(value, str):
        raise CLIError(key, f"expected a strategy name (auto, single, pipeline ...), got {value!r}")
    try:
        check_strategy_name(value)
    except ConfigError as exc:
        raise CLIError(key, _one_line(str(exc))) from None


def _check_dataclass_args(sim: dict[str, Any]) -> None:
    """Simulator arguments that are dataclasses (``buffer: BufferConfig``) given as a
    mapping: a clear error for anything else and for unknown keys."""
    from .simulator import Simulator

    for name, cls in _dataclass_params(Simulator).items():
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
    import math

    if isinstance(value, float) and not math.isfinite(value):
        raise CLIError(key or "config", f"expected a finite number, got {value}")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(v, f"{key}.{i}" if key else str(i))


def _resolve_list_item(value: Any, key: str, kind: str, base: str) -> Any:
    if isinstance(value, list):  # [[a, b], [c]]: a pipeline, one inner list per rank
        return [_resolve_list_item(v, f"{key}.{i}", kind, base) for i, v in enumerate(value)]
    return _resolve_component(value, key, kind, base)


def _dataclass_keys(cls: type) -> list[str]:
    import dataclasses

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
    structures = data["structures"]
    if not structures.startswith(BUILTIN_PREFIX) and Path(structures).expanduser().exists():
        # absolute, so that the saved config re-runs from any working directory
        data["structures"] = os.path.abspath(Path(structures).expanduser())


_SAMPLER_BASE = "alchemi_lit.data.sampler.SizeAwareSampler"


def _check_sampler(data: dict[str, Any]) -> None:
    """``data.sampler``: budgets for SizeAwareSampler (a mapping) or a registered sampler
    (``class_path``: a SizeAwareSampler subclass; the CLI passes the structures as its
    first argument, ``dataset``)."""
    from .data import SizeAwareSampler

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
        data["sampler"] = _resolve_component(
            spec, "data.sampler", "sampler", _SAMPLER_BASE, given=("dataset",)
        )
        return
    _check_keys(spec, SamplerConfig, "data.sampler")
    if spec.get("max_atoms") is None:
        raise CLIError("data.sampler.max_atoms", "required: the most atoms in flight at once")
    _check_init_args(SizeAwareSampler, spec, "data.sampler", given=("dataset",))


def _check_output(conf: dict[str, Any]) -> None:
    if conf.get("output") is None:
        conf.pop("output", None)
    _check_keys(conf.get("output"), OutputConfig, "output")


def _config_parser(command: str) -> Any:
    from jsonargparse import ActionConfigFile, ArgumentParser

    from .help_format import ReadableDefaults
    from .simulator import Simulator

    parser = ArgumentParser(
        prog=f"alchemi-lit {command}",
        description=COMMANDS[command],
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


def _parse(command: str, req: _Request) -> tuple[Any, Any, dict[str, Any]]:
    """(parser, namespace, resolved plain dict) for run/validate."""
    from jsonargparse import ArgumentError

    conf = _assemble(req)
    parser = _config_parser(command)
    if _help_only(req):  # help needs no config (and must not fail on one)
        argv = list(req.passthrough)
    else:
        argv = [*(["--config", _config_text(conf)] if conf else []), *req.passthrough]
    try:
        cfg = parser.parse_args(argv)
    except ArgumentError as exc:
        raise CLIError(None, _explain_jsonargparse(str(exc), "")) from None
    resolved = _resolved_dict(parser, cfg)
    return parser, cfg, resolved


def _config_text(conf: dict[str, Any]) -> str:
    """The merged config as JSON that jsonargparse's YAML loader reads back unchanged: YAML
    rejects JSON's surrogate-pair escapes of characters beyond U+FFFF (emoji, rare CJK in a
    path), so those stay literal; characters YAML does not print, or reads as line breaks
    (U+0085, U+2028, U+2029), and the byte order mark stay escaped."""
    text = json.dumps(conf, default=str, ensure_ascii=False)
    return re.sub(
        "[^\t\n\r\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]",
        lambda m: f"\\u{ord(m.group()):04x}",
        text,
    )


def _resolved_dict(parser: Any, cfg: Any) -> dict[str, Any]:
    import yaml

    text = parser.dump(cfg)
    resolved = yaml.safe_load(text) or {}
    resolved.pop("config", None)
    return resolved


# ---------------------------------------------------------------------- instantiation
def _instantiate(value: Any, key: str) -> Any:
    """Build plugins (dicts with class_path) recursively; errors name the key."""
    if isinstance(value, dict) and isinstance(value.get("class_path"), str):
        cls = _import_class(value["class_path"], f"{key}.class_path")
        init = value.get("init_args") or {}
        kwargs = {k: _instantiate(v, f"{key}.init_args.{k}") for k, v in init.items()}
        kwargs.update(value.get("dict_kwargs") or {})
        try:
            return cls(**kwargs)
        except Exception as exc:
            raise CLIError(
                _key_for(exc, f"{key}.init_args", list(kwargs), key), _one_line(str(exc))
            ) from exc
    if isinstance(value, list):
        return [_instantiate(v, f"{key}.{i}") for i, v in enumerate(value)]
    return value


def _key_for(exc: BaseException, prefix: str, names: list[str], fallback: str) -> str:
    """The parameter an error message is about: the one of ``names`` it mentions, if only
    one is mentioned; otherwise ``fallback`` (the object's own key)."""
    text = re.sub(r"^\w+:\s*", "", str(exc))  # "FIRE: fmax ..." -> "fmax ..."
    found = [n for n in names if re.search(rf"(?<![\w.]){re.escape(n)}(?![\w])", text)]
    if len(found) > 1:  # "devices=2 ... use strategy 'replicas'": the one given a value
        found = [n for n in found if re.search(rf"(?<![\w.]){re.escape(n)}=(?!=)", text)]
    return f"{prefix}.{found[0]}" if len(found) == 1 else fallback


@dataclass
class _Built:
    sim: Any
    atoms: list[Any]
    source: Any  # list of atoms or a SizeAwareSampler
    data: dict[str, Any]
    output: dict[str, Any]


def _build(resolved: dict[str, Any], resuming: bool = False) -> _Built:
    """Everything a run needs, checked; ``resuming``: the stores hold this very run's
    results so far, so they are not refused for existing or holding its ids."""
    from .simulator import Simulator

    sim_cfg = dict(resolved["simulator"])
    kwargs = {k: _instantiate(v, f"simulator.{k}") for k, v in sim_cfg.items()}
    for k, cls in _dataclass_params(Simulator).items():  # e.g. buffer: BufferConfig
        if isinstance(kwargs.get(k), dict):
            try:
                kwargs[k] = cls(**kwargs[k])
            except Exception as exc:
                raise CLIError(
                    _key_for(exc, f"simulator.{k}", list(kwargs[k]), f"simulator.{k}"),
                    _one_line(str(exc)),
                ) from exc
    try:
        sim = Simulator(**kwargs)
    except Exception as exc:
        raise CLIError(
            _key_for(exc, "simulator", list(kwargs), "simulator"), _one_line(str(exc))
        ) from exc
    data = resolved["data"]
    atoms = _read_structures(data)
    first = data.get("first_id")
    ids = None if first is None else list(range(int(first), int(first) + len(atoms)))
    source: Any = atoms
    if ids is not None:
        from .state import Batch

        try:
            source = Batch.from_atoms(atoms, system_ids=ids, dtype=sim.dtype)
        except Exception as exc:
            raise CLIError("data.structures", _one_line(str(exc))) from exc
    spec = data.get("sampler")
    if spec:
        from .data import SizeAwareSampler

        if "class_path" in spec:  # a registered sampler: its init_args (may hold plugins)
            cls = _import_class(spec["class_path"], "data.sampler.class_path")
            prefix = "data.sampler.init_args"
            args = {
                k: _instantiate(v, f"{prefix}.{k}") for k, v in (spec["init_args"] or {}).items()
            }
            if ids is not None:
                raise CLIError("data.first_id", "applies to the built-in sampler only")
        else:  # the budgets shorthand
            cls, prefix, args = SizeAwareSampler, "data.sampler", dict(spec)
            if ids is not None:
                args["system_ids"] = ids
        try:
            source = cls(atoms, **args)
        except Exception as exc:
            raise CLIError(
                _key_for(exc, prefix, list(args), "data.sampler"), _one_line(str(exc))
            ) from exc
    _check_sinks(sim, resolved, source, resuming)
    return _Built(sim, atoms, source, data, resolved.get("output") or {})


def _dataclass_params(cls: type) -> dict[str, type]:
    """Parameters of ``cls.__init__`` annotated with a dataclass (or ``X | None``)."""
    import dataclasses
    import typing

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


def _read_structures(data: dict[str, Any]) -> list[Any]:
    from .data import BUILTIN_SETS, read_structures

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
        params = _init_params_fn(fn)
        for k in args:
            if params is not None and k not in params:
                close = difflib.get_close_matches(str(k), sorted(params), n=1)
                hint = f" Did you mean {close[0]}?" if close else ""
                raise CLIError(
                    f"data.builtin_args.{k}",
                    f"builtin:{name} has no argument {k!r}.{hint} "
                    f"Arguments: {', '.join(sorted(params))}",
                )
        _check_function_args(fn, args, "data.builtin_args")
        try:
            return fn(**args)
        except Exception as exc:
            raise CLIError(
                _key_for(exc, "data.builtin_args", list(args), "data.builtin_args"),
                _one_line(str(exc)),
            ) from exc
    try:
        atoms = read_structures(spec, index=data.get("index") or ":", format=data.get("format"))
    except Exception as exc:
        text = str(exc)
        key = "data.structures"
        if text.startswith("index "):
            key = "data.index"
        elif text.startswith("unknown structure file format"):
            key = "data.format"
        raise CLIError(key, _one_line(text)) from exc
    if args:
        raise CLIError(
            "data.builtin_args", f"only applies to builtin: sets, not to the file {spec!r}"
        )
    return atoms


def _check_function_args(fn: Any, args: dict[str, Any], key: str) -> None:
    """Type-check keyword arguments of a function against its signature (like init_args)."""
    from jsonargparse import ArgumentError, ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    try:
        parser.add_function_arguments(fn, fail_untyped=False)
    except Exception:  # a signature jsonargparse cannot describe: leave it to the call
        return
    try:
        parser.parse_object(copy.deepcopy(args))
    except ArgumentError as exc:
        raise CLIError(None, _explain_jsonargparse(str(exc), key, fn.__name__)) from None


def _init_params_fn(fn: Any) -> set[str] | None:
    sig = inspect.signature(fn)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return set(sig.parameters)


def _sink_keys(resolved: dict[str, Any]) -> list[str]:
    sinks = resolved["simulator"].get("sinks") or []
    return [f"simulator.sinks.{i}" for i in range(len(sinks))]


def _check_sinks(sim: Any, resolved: dict[str, Any], source: Any, resuming: bool) -> None:
    """Refuse, before anything runs, to write into an existing store that mode 'w-'
    protects, to append to a store systems whose ids it already holds, or to write
    where no store can be created (a file in the way, no permission)."""
    from .simulator import input_system_ids
    from .sinks import ZarrSink, id_list

    ids = input_system_ids(source)

    out = resolved.get("output") or {}
    if out.get("dir") is not None:
        _check_writable(Path(out["dir"]), "output.dir", "output directory")
    for key, sink in zip(_sink_keys(resolved), sim.sinks or []):
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
    path = path.expanduser()
    if path.exists() and not path.is_dir():
        raise CLIError(key, f"{what} {str(path)!r} exists and is a file, not a directory")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if parent != path and not parent.is_dir():
        raise CLIError(key, f"cannot create {what} {str(path)!r}: {str(parent)!r} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CLIError(
            key,
            f"cannot create {what} {str(path)!r}: no write permission in {str(parent)!r}; "
            f"choose a writable location",
        )


def _check_structures(built: _Built, full: bool) -> dict[str, Any]:
    """Model supports every element (cheap); with ``full`` every structure is validated
    and the sampler budgets are checked (``sampler.bind``).  Returns facts for display."""
    import numpy as np
    from ase.data import chemical_symbols

    from .data import SizeAwareSampler
    from .state import Batch

    sim, atoms = built.sim, built.atoms
    model = sim.model
    supported = getattr(model, "supported_elements", None)
    elements: set[int] = set()
    for k, a in enumerate(atoms):
        z = set(np.unique(a.numbers).tolist())
        if supported is not None and not z <= set(supported):
            src = built.source
            sid = (
                int(src.system_ids[k])
                if isinstance(src, SizeAwareSampler)
                else int(src.system_id[k])
                if isinstance(src, Batch)
                else k
            )
            try:
                model.check_batch(Batch.from_atoms([a], system_ids=[sid], validate=False))
            except Exception as exc:
                raise CLIError("data.structures", _one_line(str(exc))) from exc
        elements |= z
    if full:
        try:
            if isinstance(built.source, SizeAwareSampler):
                built.source.bind(model.cutoff + model.neighbors.skin)
            else:
                Batch.from_atoms(atoms, dtype=sim.dtype, validate=True)
        except Exception as exc:
            key = "data.sampler" if "max_" in str(exc) else "data.structures"
            raise CLIError(key, _one_line(str(exc))) from exc
    _check_transfer_buffer(built)
    return {
        "systems": len(atoms),
        "atoms": int(sum(len(a) for a in atoms)),
        "elements": " ".join(chemical_symbols[z] for z in sorted(elements)),
    }


def _check_transfer_buffer(built: _Built) -> None:
    """Pipelines/replicas: every system must fit the transfer buffer (checked before any
    rank starts, so the error names the config key rather than failing in a launch)."""
    from .data import SizeAwareSampler
    from .strategies.distributed import DistributedStrategy

    strategy = built.sim.strategy
    if not isinstance(strategy, DistributedStrategy) or not built.atoms:
        return
    sampler = built.source
    if not isinstance(sampler, SizeAwareSampler):
        sampler = SizeAwareSampler(built.atoms, max_atoms=max(sum(len(a) for a in built.atoms), 1))
    try:
        strategy.validate(sampler, built.sim.model.cutoff + built.sim.model.neighbors.skin)
    except Exception as exc:
        text = str(exc)
        key = next(
            (f"simulator.buffer.{f}" for f in ("num_atoms", "num_edges") if f in text),
            "simulator",
        )
        raise CLIError(key, _one_line(text)) from exc


# ---------------------------------------------------------------------- run / validate
def _run_or_validate(command: str, args: list[str]) -> int:
    req = _split_argv(args)
    if req.help is not None:
        code = _class_help(command, *req.help)
        if code is not None:
            return code
    _parser, _cfg, resolved = _parse(command, req)
    built = _build(resolved, resuming=command == "run" and req.resume not in (None, False))
    facts = _check_structures(built, full=command == "validate")
    if command == "validate":
        _print_validation(built, facts)
        return 0
    return _run(built, resolved, _resume_path(built, req.resume))


def _resume_path(built: _Built, resume: str | bool | None) -> str | bool | None:
    """What ``--resume`` asks for: a checkpoint path, or True (the Checkpoint callback's
    folder; without one, or without a checkpoint there, the systems the stores lack)."""
    if resume is None or resume is False:
        return None
    return resume


def _describe_sink(sink: Any) -> str:
    from .sinks import HostMemory, ZarrSink

    if isinstance(sink, ZarrSink):
        return f"{sink.path} (ZarrSink, mode {sink.mode!r})"
    if isinstance(sink, HostMemory):
        return f"host memory (capacity {sink.capacity or 'unlimited'})"
    return type(sink).__name__


def _print_validation(built: _Built, facts: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from .data import SizeAwareSampler

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
    if isinstance(src, SizeAwareSampler):
        budget = (
            f"max_atoms {src.max_atoms}, max_systems {src.max_systems or '-'}, "
            f"max_edges {src.max_edges or '-'}"
        )
        table.add_row("batching", f"inflight ({budget})")
    else:
        table.add_row("batching", "one batch of all systems")
    Console(width=_width()).print(table)


def _width() -> int | None:
    return None if sys.stdout.isatty() else 120


def _output_paths(built: _Built) -> tuple[Path | None, Path | None]:
    from .sinks import ZarrSink

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


def _run(built: _Built, resolved: dict[str, Any], resume: str | bool | None = None) -> int:
    import yaml
    from rich.console import Console

    from .sinks import HostMemory, ZarrSink

    sim = built.sim
    sim.config = resolved
    if not _is_main_rank():  # a rank a launcher re-executed: it runs, rank 0 reports
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

    from .report import read_store_systems, summarize

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
    from .report import summary_table

    Console(width=_width()).print(
        summary_table(summary, title="alchemi-lit run: summary", where=where)
    )
    return 0


def _optimizer_flags(plan: Any, k: int) -> list[bool] | None:
    """Which of the ``k`` stage-history columns are optimizer stages (None: unknown)."""
    from .stages import Fused

    if isinstance(plan, Fused):
        flags = [bool(s.is_optimizer) for s in plan.stages]
    else:  # a pipeline (replicas repeat its columns)
        columns = set(plan.optimizer_columns())
        flags = [c in columns for c in range(k)]
    return flags if len(flags) == k else None


def _write_output(path: Path, text: str, built: _Built) -> None:
    """Write the resolved config or summary; a failure names the key that chose ``path``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        from .sinks import ZarrSink

        key = "output.dir"
        if built.output.get("dir") is None:  # next to the first ZarrSink store
            first = next(i for i, s in enumerate(built.sim.sinks) if isinstance(s, ZarrSink))
            key = f"simulator.sinks.{first}.init_args.store"
        raise CLIError(
            key,
            f"cannot write {str(path)!r} ({exc.strerror or exc}); choose a writable output.dir "
            f"(or store location)",
        ) from exc


def _is_main_rank() -> bool:
    """False in the extra processes of a multi-rank launch (Fabric, torchrun, SLURM)."""
    for var in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        value = os.environ.get(var)
        if value is not None and value.strip().isdigit():
            return int(value) == 0
    return True


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
    from .callbacks import ThermoMonitor

    for cb in sim.callbacks:
        if isinstance(cb, ThermoMonitor):
            rec = cb.records()
            if len(rec["T"]) == 0:
                return None
            last = rec["loop_step"] >= 0.9 * rec["loop_step"].max()
            return float(rec["T"][last].mean())
    return None


# ---------------------------------------------------------------------- plugins / report
def _plugins(args: list[str]) -> int:
    from jsonargparse import ArgumentError, ArgumentParser
    from rich.console import Console

    from . import registry

    parser = ArgumentParser(
        prog="alchemi-lit plugins", description=COMMANDS["plugins"], exit_on_error=False
    )
    parser.add_argument(
        "--kind", type=str | None, default=None, help=f"only this kind: {', '.join(registry.KINDS)}"
    )
    try:
        cfg = parser.parse_args(args)
    except ArgumentError as exc:
        raise CLIError(None, _explain_jsonargparse(str(exc), "")) from None
    if cfg.kind is not None and cfg.kind not in registry.KINDS:
        close = difflib.get_close_matches(cfg.kind, registry.KINDS, n=1)
        hint = f" Did you mean {close[0]}?" if close else ""
        raise CLIError(
            "--kind", f"unknown kind {cfg.kind!r}.{hint} Kinds: {', '.join(registry.KINDS)}"
        )
    console = Console(width=_width() and 200)
    console.print(_plugin_table(cfg.kind, "alchemi-lit plugins"))
    if cfg.kind in (None, "strategy"):
        console.print(
            "strategy 'auto' (the default) picks pipeline for pipeline plans (a | b), else single",
            highlight=False,
        )
    for failure in registry.failures():
        print(
            f"warning: {failure.describe()}; its plugins are unavailable. "
            f"Fix, reinstall or uninstall that package.",
            file=sys.stderr,
        )
    return 0


def _plugin_table(kind: str | None, title: str) -> Any:
    """Registered plugins (of ``kind``, or all) as a rich table; entry points that
    failed to load are rows marked FAILED."""
    from rich.markup import escape
    from rich.table import Table

    from . import registry

    order = {k: i for i, k in enumerate(registry.KINDS)}
    entries = sorted(
        registry.all_entries(), key=lambda e: (order.get(e.kind, 99), e.is_preset, e.name.lower())
    )
    table = Table(title=title, title_justify="left")
    table.add_column("kind", no_wrap=True)
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("source", no_wrap=True)
    table.add_column("class / binds", overflow="fold")
    table.add_column("description", overflow="fold")
    for e in entries:
        if kind is not None and e.kind != kind:
            continue
        if e.is_preset:
            bound = ", ".join(f"{k}={v!r}" for k, v in e.preset_args.items())
            target = f"{e.cls.__name__}({bound})"
        else:
            target = e.import_path
        table.add_row(e.kind, e.name, escape(e.source), escape(target), escape(e.doc))
    for f in registry.failures():
        table.add_row(
            "FAILED",
            escape(f.entry_point),
            escape(f.package),
            escape(f.target),
            escape(f"failed to load: {f.error}"),
            style="red",
        )
    return table


def _report(args: list[str]) -> int:
    from jsonargparse import ArgumentError, ArgumentParser
    from rich.console import Console

    from .report import report

    parser = ArgumentParser(
        prog="alchemi-lit report", description=COMMANDS["report"], exit_on_error=False
    )
    parser.add_argument("store", type=str, help="results store written by ZarrSink (.zarr)")
    parser.add_argument(
        "--plots", type=str | None, default=None, help="directory for PNG plots (needs matplotlib)"
    )
    parser.add_argument(
        "--trajectory",
        type=str | None,
        default=None,
        help="TrajectoryWriter store to plot T / energy traces from",
    )
    try:
        cfg = parser.parse_args(args)
    except ArgumentError as exc:
        raise CLIError(None, _explain_jsonargparse(str(exc), "")) from None
    report(cfg.store, cfg.plots, cfg.trajectory, console=Console(width=_width()))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
