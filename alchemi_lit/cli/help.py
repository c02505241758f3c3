"""``--KEY.help [NAME]``: the parameters of one plugin, or the plugins that fit KEY.

jsonargparse's own ``--KEY.help CLASS`` takes a class name and shows the class's
signature defaults; a preset (``fire-ase``) is a registered name binding some
arguments, so its help is built here with those bound values as the defaults, and
``--KEY.help`` alone lists the registered plugins of KEY's kind.
"""

from __future__ import annotations

from .config import is_index
from .names import import_class, lookup, plural

#: option keys holding plugins -> registry kind (``--KEY.help [NAME]``)
HELP_KINDS = {
    "simulator.model": "model",
    "simulator.stages": "integrator",
    "simulator.callbacks": "callback",
    "simulator.sinks": "sink",
    "simulator.strategy": "strategy",
    "data.sampler": "sampler",
}


def help_kind(key: str) -> str | None:
    """The plugin kind an option key holds: ``simulator.stages.0`` -> integrator,
    ``...init_args.criterion`` -> criterion."""
    parts = [p for p in key.split(".") if p and not is_index(p) and p != "init_args"]
    if parts and parts[-1] == "criterion":
        return "criterion"
    return HELP_KINDS.get(".".join(parts))


def class_help(prog: str, key: str, name: str | None) -> int | None:
    """``--KEY.help NAME``: the parameters of one plugin, with a preset's bound values as
    the defaults; ``--KEY.help`` alone: the registered plugins that fit KEY.  None when
    KEY holds no plugin (jsonargparse answers then)."""
    from jsonargparse import ArgumentParser
    from rich.console import Console

    from ..core import registry
    from .command import console_width
    from .help_format import ReadableDefaults
    from .plugins import plugin_table

    kind = help_kind(key)
    option = f"--{key}.help"
    if name is None:
        if kind is None:
            return None
        table = plugin_table(kind, f"{option} NAME: {plural(kind)}")
        Console(width=console_width() and 200).print(table)
        print(f"parameters of one: {prog} {option} NAME")
        return 0
    path, preset = lookup(name, option, kind)
    cls = import_class(path, option)
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
        prog=f"{prog} {option} {name}",
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
