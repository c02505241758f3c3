"""Plugin registry: names -> classes, per plugin kind, with presets and entry points.

Built-ins register themselves with :func:`register`.  Third-party packages declare
an entry point in the group ``alchemi_lit.plugins``; its target (a module or a
callable) is imported/called once, lazily, the first time a registry is queried,
and registers its classes the same way.  Every name records the package it came
from, so two packages claiming one name fail with an error naming both.

Presets bind a name to a class plus arguments (``fire-ase`` -> ``FIRE(mode="ase")``)
and are usable wherever a name is (CLI ``class_path: fire-ase``).

A plugin package that fails to load (its import raises) does not take the others
down: the failure is recorded per entry point (:func:`failures`), everything else
stays usable, and the error is raised -- naming the package, the entry point and the
original exception -- only when a name is looked up that is not registered and so
could have come from the failed package.  Name conflicts stay an immediate error,
raised again on every later query (the registry is never silently partial).

This module imports nothing else of ours: any layer may register into it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, TypeVar

from .errors import ConfigError

KINDS = ("integrator", "model", "callback", "sink", "sampler", "strategy", "criterion")
ENTRY_POINT_GROUP = "alchemi_lit.plugins"
BUILTIN_SOURCE = "alchemi_lit"

T = TypeVar("T")


class PluginConflictError(ConfigError):
    """Two packages registered the same name for the same plugin kind."""


class PluginLoadError(ConfigError):
    """A name was looked up that is not registered while a plugin package failed to load."""


@dataclass(frozen=True)
class LoadFailure:
    """One ``alchemi_lit.plugins`` entry point whose loading raised."""

    package: str
    entry_point: str  # its name
    target: str  # what it points to: ``module`` or ``module:callable``
    error: str  # ``ExceptionType: message`` of the original exception

    def describe(self) -> str:
        return (
            f"plugin entry point {self.entry_point!r} ({self.target}) of package "
            f"{self.package!r} failed to load ({self.error})"
        )


@dataclass(frozen=True)
class Entry:
    """One registered name."""

    name: str
    kind: str
    cls: type
    source: str
    preset_args: dict[str, Any] = field(default_factory=dict)

    @property
    def is_preset(self) -> bool:
        return bool(self.preset_args)

    @property
    def doc(self) -> str:
        """First line of the class docstring."""
        text = (self.cls.__doc__ or "").strip().splitlines()
        return text[0] if text else ""

    def create(self, **kwargs: Any) -> Any:
        return self.cls(**{**self.preset_args, **kwargs})

    @property
    def import_path(self) -> str:
        return f"{self.cls.__module__}.{self.cls.__qualname__}"


class Registry:
    """Names of one plugin kind."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def add(self, entry: Entry) -> None:
        key = entry.name.lower()
        old = self._entries.get(key)
        if old is not None and (old.cls is not entry.cls or old.preset_args != entry.preset_args):
            raise PluginConflictError(
                f"{self.kind} name {entry.name!r} is registered twice: by package "
                f"{old.source!r} ({old.import_path}) and by package {entry.source!r} "
                f"({entry.import_path}); uninstall one of them or register under another name"
            )
        self._entries[key] = entry

    def get(self, name: str) -> Entry:
        _load_entry_points()
        try:
            return self._entries[name.lower()]
        except KeyError:
            raise unknown_name_error(name, self.kind) from None

    def __contains__(self, name: str) -> bool:
        _load_entry_points()
        return name.lower() in self._entries

    def names(self) -> list[str]:
        _load_entry_points()
        return [e.name for e in self._entries.values()]

    def __iter__(self) -> Iterator[Entry]:
        _load_entry_points()
        return iter(sorted(self._entries.values(), key=lambda e: e.name.lower()))


REGISTRIES: dict[str, Registry] = {k: Registry(k) for k in KINDS}
_loading_source = threading.local()


def _current_source(cls: type) -> str:
    src = getattr(_loading_source, "name", None)
    if src:
        return src
    top = cls.__module__.split(".")[0]
    return BUILTIN_SOURCE if top == "alchemi_lit" else top


def register(kind: str, name: str | None = None) -> Callable[[type[T]], type[T]]:
    """Class decorator: ``@register("integrator")`` registers under the class name."""
    if kind not in REGISTRIES:
        raise ValueError(f"unknown plugin kind {kind!r}; choose one of {KINDS}")

    def deco(cls: type[T]) -> type[T]:
        REGISTRIES[kind].add(Entry(name or cls.__name__, kind, cls, _current_source(cls)))
        return cls

    return deco


def register_preset(kind: str, name: str, cls: type, **kwargs: Any) -> None:
    """Bind ``name`` to ``cls`` with default arguments ``kwargs``."""
    REGISTRIES[kind].add(Entry(name, kind, cls, _current_source(cls), dict(kwargs)))


def get(kind: str, name: str) -> Entry:
    """Look up a plugin by kind and (case-insensitive) name."""
    if kind not in REGISTRIES:
        raise ValueError(f"unknown plugin kind {kind!r}; choose one of {KINDS}")
    return REGISTRIES[kind].get(name)


def find(name: str) -> Entry | None:
    """Look up a name across all kinds (the CLI resolves ``class_path`` this way)."""
    _load_entry_points()
    for reg in REGISTRIES.values():
        entry = reg._entries.get(name.lower())
        if entry is not None:
            return entry
    return None


def all_entries() -> list[Entry]:
    _load_entry_points()
    return [e for reg in REGISTRIES.values() for e in reg]


def failures() -> list[LoadFailure]:
    """Entry points that failed to load (their packages' plugins are unavailable)."""
    _load_entry_points()
    return list(_failures)


def did_you_mean(name: str, pool: Iterable[str], n: int = 3) -> str:
    """`` Did you mean X?`` with the closest names of ``pool`` (case-insensitive), or ""."""
    import difflib

    spelled = {p.lower(): p for p in pool}
    close = difflib.get_close_matches(name.lower(), list(spelled), n=n, cutoff=0.6)
    return f" Did you mean {', '.join(spelled[c] for c in close)}?" if close else ""


def unknown_name_error(name: str, kind: str | None = None) -> ConfigError:
    """The error for a name no registry (of ``kind``, or of any kind) holds.

    Did-you-mean hints come from the registered names; when plugin packages failed to
    load, the name may be theirs, so the error is a :class:`PluginLoadError` that
    leads with those failures (package, entry point, original exception)."""
    _load_entry_points()
    if kind is not None:
        pool = REGISTRIES[kind].names()
        what = kind
    else:
        pool = sorted({e.name for reg in REGISTRIES.values() for e in reg._entries.values()})
        what = "plugin"
    hint = did_you_mean(name, pool)
    known = f" Known: {', '.join(sorted(pool, key=str.lower))}." if kind is not None else ""
    listing = (
        f"`alchemi-lit plugins --kind {kind}`" if kind is not None else "`alchemi-lit plugins`"
    )
    if _failures:
        broken = "; ".join(f.describe() for f in _failures)
        return PluginLoadError(
            f"{what} {name!r} is not registered, and it may come from a plugin package that "
            f"failed to load: {broken}. Fix, reinstall or uninstall that package "
            f"(`alchemi-lit plugins` lists failed plugins).{hint}"
        )
    return ConfigError(f"unknown {what} {name!r}.{hint}{known} Run {listing} to list them.")


_entry_points_loaded = False
_entry_points_loading = False  # re-entrant calls while a plugin loads see the partial registry
_entry_point_lock = threading.RLock()
_failures: list[LoadFailure] = []
_conflict: PluginConflictError | None = None


def _load_entry_points() -> None:
    """Import built-ins and every ``alchemi_lit.plugins`` entry point, once.

    A failing entry point is recorded (:func:`failures`) and the others still load;
    a name conflict is raised now and on every later query."""
    global _entry_points_loaded, _entry_points_loading, _conflict
    if _entry_points_loaded:
        if _conflict is not None:
            raise _conflict
        return
    with _entry_point_lock:
        if _entry_points_loaded or _entry_points_loading:
            if _conflict is not None:
                raise _conflict
            return
        _entry_points_loading = True
        try:
            _load_builtins()
            _failures.clear()
            _conflict = None
            for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
                if ep.value == BUILTIN_MODULE:
                    continue  # (loaded first, above)
                package = ep.dist.name if ep.dist is not None else ep.module
                _loading_source.name = package
                try:
                    target = ep.load()
                    if callable(target) and not isinstance(target, type):
                        target()
                except PluginConflictError as exc:
                    _conflict = exc
                    break
                except Exception as exc:
                    _failures.append(
                        LoadFailure(package, ep.name, ep.value, f"{type(exc).__name__}: {exc}")
                    )
                finally:
                    _loading_source.name = None
            _entry_points_loaded = True
        finally:
            _entry_points_loading = False
    if _conflict is not None:
        raise _conflict


#: the module registering the built-in plugins: found, like any plugin package, through
#: its entry point (so this module imports nothing above it), and loaded first
BUILTIN_MODULE = "alchemi_lit.plugins_builtin"


def _load_builtins() -> None:
    """Register the built-ins; unlike a third-party package's, their failure is fatal."""
    import importlib

    ours = [
        ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.value == BUILTIN_MODULE
    ]
    if ours:
        ours[0].load()
    else:  # a source checkout that was never installed: no entry-point metadata
        importlib.import_module(BUILTIN_MODULE)


def reset_for_tests() -> None:
    """Forget entry points so a test can install a plugin and reload (tests only)."""
    global _entry_points_loaded, _conflict
    with _entry_point_lock:
        _entry_points_loaded = False
        _conflict = None
        _failures.clear()
