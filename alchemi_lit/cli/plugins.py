"""``alchemi-lit plugins [--kind KIND]``: every registered plugin, and the failed ones."""

from __future__ import annotations

import difflib
import sys
from typing import TYPE_CHECKING, Any

from .command import Command, console_width
from .errors import CLIError

if TYPE_CHECKING:
    from .app import CLI


class PluginsCommand(Command):
    """Lists the registry: built-ins, entry-point plugins and their presets."""

    help = "list every registered plugin (integrators, models, callbacks, sinks, ...)"

    def add_arguments(self, parser: Any) -> None:
        from ..core import registry

        parser.add_argument(
            "--kind",
            type=str | None,
            default=None,
            help=f"only this kind: {', '.join(registry.KINDS)}",
        )

    def execute(self, cli: CLI, cfg: Any) -> int:
        from rich.console import Console

        from ..core import registry

        if cfg.kind is not None and cfg.kind not in registry.KINDS:
            close = difflib.get_close_matches(cfg.kind, registry.KINDS, n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            raise CLIError(
                "--kind", f"unknown kind {cfg.kind!r}.{hint} Kinds: {', '.join(registry.KINDS)}"
            )
        console = Console(width=console_width() and 200)
        console.print(plugin_table(cfg.kind, f"{cli.prog} plugins"))
        if cfg.kind in (None, "strategy"):
            console.print(
                "strategy 'auto' (the default) picks pipeline for pipeline plans (a | b), "
                "else single",
                highlight=False,
            )
        for failure in registry.failures():
            print(
                f"warning: {failure.describe()}; its plugins are unavailable. "
                f"Fix, reinstall or uninstall that package.",
                file=sys.stderr,
            )
        return 0


def plugin_table(kind: str | None, title: str) -> Any:
    """Registered plugins (of ``kind``, or all) as a rich table; entry points that
    failed to load are rows marked FAILED."""
    from rich.markup import escape
    from rich.table import Table

    from ..core import registry

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
