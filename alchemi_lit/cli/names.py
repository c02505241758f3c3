"""Plugin names in a config: registered names, presets and import paths -> classes.

jsonargparse 4.53 resolves ``class_path: FIRE`` only to a subclass with exactly that
class name; it knows neither the registry's presets (``fire-ase`` = ``FIRE(mode="ase")``)
nor its aliases (``lj-argon``) nor case-insensitive names, and it checks the
``init_args`` of a ``Union``-typed list as a whole (one error listing every subtype).
So each plugin entry is resolved here, against :mod:`alchemi_lit.core.registry`, to
``{class_path: import.path, init_args: {...}}`` with the preset's arguments as
defaults, and its ``init_args`` are type-checked against its own signature with a
small jsonargparse parser per class: an error names the exact key.
"""

from __future__ import annotations

import copy
import difflib
import importlib
import inspect
from typing import Any

from .errors import CLIError, annotation_of, rejected, unexplained

COMPONENT_META = ("class_path", "init_args", "dict_kwargs")

#: Simulator arguments holding plugins: registry kind, base class (import path), is a list
COMPONENTS = {
    "model": ("model", "alchemi_lit.models.base.Model", False),
    "stages": ("integrator", "alchemi_lit.integrators.base.Integrator", True),
    "callbacks": ("callback", "alchemi_lit.engine.hooks.Callback", True),
    "sinks": ("sink", "alchemi_lit.sinks.Sink", True),
}


def plural(kind: str) -> str:
    return {"strategy": "strategies", "criterion": "criteria"}.get(kind, f"{kind}s")


def a(noun: str) -> str:
    """``noun`` with its indefinite article: "an integrator", "a model"."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def lookup(name: str, key: str, kind: str | None) -> tuple[str, dict[str, Any]]:
    """A ``class_path`` value -> (import path, preset args).  Dotted paths pass through."""
    from ..core import registry
    from ..core.errors import ConfigError

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
                f"{name!r} is a registered {other.kind}, not {a(kind)}; "
                f"`alchemi-lit plugins --kind {kind}` lists the {plural(kind)}",
            )
        try:
            registry.get(kind, name)  # raises with the close matches of this kind
        except ConfigError as exc:
            raise CLIError(key, str(exc)) from None
    entry = registry.find(name)
    if entry is None:
        raise CLIError(key, str(registry.unknown_name_error(name)))
    return entry.import_path, dict(entry.preset_args)


def import_class(path: str, key: str) -> type:
    """The class an import path names; every failure is a :class:`CLIError` on ``key``."""
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


def init_params(cls: type) -> set[str] | None:
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


def function_params(fn: Any) -> set[str] | None:
    """Names ``fn(...)`` accepts; None if it takes ``**kwargs``."""
    sig = inspect.signature(fn)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return set(sig.parameters)


def resolve_component(
    value: Any, key: str, kind: str | None, base_path: str | None, given: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Normalise one plugin entry to ``{class_path: import.path, init_args: {...}}``.
    ``given``: constructor parameters the CLI passes itself (a sampler's ``dataset``)."""
    if isinstance(value, str):
        value = {"class_path": value}
    if not isinstance(value, dict):
        what = a(kind) if kind else "a plugin"
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
    extra = {k: v for k, v in value.items() if k not in COMPONENT_META}
    init = {**init, **extra}  # parameters written next to class_path
    path, preset = lookup(name, f"{key}.class_path", kind)
    cls = import_class(path, f"{key}.class_path")
    if base_path is not None:
        base = import_class(base_path, key)
        if not issubclass(cls, base):
            raise CLIError(
                f"{key}.class_path",
                f"{cls.__name__} is not {a(kind or 'plugin')} (not a subclass of {base.__name__})",
            )
    init = {**preset, **init}
    init = {k: resolve_nested(v, f"{key}.init_args.{k}") for k, v in init.items()}
    check_init_args(cls, init, f"{key}.init_args", given)
    out: dict[str, Any] = {"class_path": path, "init_args": init}
    if value.get("dict_kwargs") is not None and not isinstance(value["dict_kwargs"], dict):
        raise CLIError(
            f"{key}.dict_kwargs",
            f"expected a mapping of keyword arguments, got {value['dict_kwargs']!r}",
        )
    if value.get("dict_kwargs"):
        out["dict_kwargs"] = value["dict_kwargs"]
    return out


def resolve_nested(value: Any, key: str) -> Any:
    """Resolve registered names of plugins nested anywhere (criteria, sub-objects)."""
    if isinstance(value, dict):
        if isinstance(value.get("class_path"), str):
            return resolve_component(value, key, None, None)
        return {k: resolve_nested(v, f"{key}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_nested(v, f"{key}.{i}") for i, v in enumerate(value)]
    return value


def check_init_args(cls: type, init: dict[str, Any], key: str, given: tuple[str, ...] = ()) -> None:
    """Type-check ``init`` against the signature of ``cls`` (one jsonargparse parser per
    class).  ``given``: parameters the CLI passes itself, not accepted from the config."""
    from jsonargparse import ArgumentParser

    for name in given:
        if name in init:
            raise CLIError(
                f"{key}.{name}",
                "set by alchemi-lit itself (the structures of data.structures); remove it",
            )
    params = init_params(cls)
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

    def parser(skip: set[str]) -> Any:
        p = ArgumentParser(exit_on_error=False)
        p.add_class_arguments(cls, fail_untyped=False, skip=set(given) | skip)
        return p

    _parse_object(parser, _signature(cls.__init__, given), init, key, cls)


def check_function_args(fn: Any, args: dict[str, Any], key: str) -> None:
    """Type-check keyword arguments of a function against its signature (like init_args)."""
    from jsonargparse import ArgumentParser

    def parser(skip: set[str]) -> Any:
        p = ArgumentParser(exit_on_error=False)
        p.add_function_arguments(fn, fail_untyped=False, skip=skip)
        return p

    _parse_object(parser, _signature(fn, ()), args, key, fn)


def _signature(fn: Any, given: tuple[str, ...]) -> dict[str, inspect.Parameter]:
    """The named parameters of ``fn`` a config may set (not ``self``, ``*args``, ``given``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return {
        n: p for n, p in params.items() if n != "self" and p.kind not in variadic and n not in given
    }


def _parse_object(
    parser: Any, params: dict[str, inspect.Parameter], values: dict[str, Any], key: str, owner: Any
) -> None:
    """Parse ``values`` with ``parser(skip)``; on an error, find the parameter it is about
    by parsing each one alone (the others skipped) -- never by reading the message."""
    from jsonargparse import ArgumentError

    try:
        whole = parser(set())
    except Exception:  # a signature jsonargparse cannot describe: leave it to the constructor
        return
    for name, p in params.items():
        if p.default is inspect.Parameter.empty and name not in values:
            raise CLIError(f"{key}.{name}", f"required by {owner.__name__} but not given")
    try:
        whole.parse_object(copy.deepcopy(values))  # it converts nested dicts in place
    except ArgumentError as exc:
        for name, value in values.items():
            try:
                parser(set(params) - {name}).parse_object({name: copy.deepcopy(value)})
            except ArgumentError:
                raise rejected(f"{key}.{name}", value, annotation_of(owner, name)) from None
        raise unexplained(exc, key) from None
