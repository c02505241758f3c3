"""The :class:`CLI` class: ``alchemi-lit``'s commands and the hooks a subclass overrides.

As in LightningCLI, the command line is a class: subclass it to add options to the
run / validate config (:meth:`CLI.add_arguments_to_parser`), change the resolved config
before anything is built (:meth:`CLI.before_instantiate`), build the Simulator your way
(:meth:`CLI.build_simulator`) or add commands (:meth:`CLI.subcommands`), and call
``MyCLI().main()`` from your own console script.
"""

from __future__ import annotations

import difflib
import sys
import traceback
import warnings
from typing import Any

from .argv import Request
from .command import Command
from .errors import EXIT_USAGE, CLIError, classify


class CLI:
    """``alchemi-lit``: run, validate and inspect simulations from YAML configs.

    Every user error ends as ONE line on stderr naming the key, exit status 2 (``--debug``
    adds the traceback).  Lightning Fabric is never imported here (single-device runs do
    not need it and it costs seconds to import).
    """

    #: the program name in usage lines and help
    prog = "alchemi-lit"
    #: the line under the usage of ``alchemi-lit --help``
    description = "Relax and simulate thousands of atomic structures at once."

    # ------------------------------------------------------------------ hooks
    def subcommands(self) -> dict[str, Command]:
        """Command name -> :class:`Command`.  Extend it to add commands:
        ``return {**super().subcommands(), "mine": MyCommand()}``."""
        from .merge import MergeCommand
        from .plugins import PluginsCommand
        from .report import ReportCommand
        from .run import RunCommand
        from .workflow import WorkflowCommand

        return {
            "run": RunCommand(validate=False),
            "validate": RunCommand(validate=True),
            "plugins": PluginsCommand(),
            "report": ReportCommand(),
            "merge": MergeCommand(),
            **{name: WorkflowCommand(name) for name in (
                "eos", "elastic", "phonons", "vibrations", "qha", "order")},
        }

    def add_arguments_to_parser(self, parser: Any) -> None:
        """Add options to the run / validate config parser (a jsonargparse ArgumentParser
        holding ``simulator``, ``data`` and ``output``).  What you add is a config key
        like the others: in YAML files, as ``--key value``, in ``--print_config`` and in
        the saved config; the hooks below find its value in ``config``."""

    def before_instantiate(self, config: dict[str, Any]) -> dict[str, Any]:
        """Change the resolved config (a plain dict, what ``--print_config`` prints and
        the run saves) before any object is built; return it."""
        return config

    def build_simulator(self, config: dict[str, Any]) -> Any:
        """The :class:`~alchemi_lit.Simulator` of ``config["simulator"]``; errors raised as
        :class:`CLIError` name their key."""
        from .build import build_simulator

        return build_simulator(config)

    # ------------------------------------------------------------------ config
    def config_parser(self, command: str) -> Any:
        """The jsonargparse parser of ``run`` / ``validate``, with your arguments."""
        from .sections import config_parser

        commands = self.subcommands()
        description = commands[command].help if command in commands else ""
        parser = config_parser(f"{self.prog} {command}", description)
        self.add_arguments_to_parser(parser)
        return parser

    def parse(self, command: str, req: Request) -> dict[str, Any]:
        """The resolved config of a run / validate command line: config files and
        overrides merged, plugin names resolved and checked, parsed by jsonargparse
        (which exits here for ``--help`` and ``--print_config``)."""
        from ..core import registry
        from .checks import check_config
        from .config import merged_config, parse_config
        from .sections import Sections

        registry.all_entries()  # entry-point plugins register before any name is looked up
        parser = self.config_parser(command)
        conf = merged_config(req.configs, req.overrides, Sections.of(parser))
        if req.help_only:  # help needs no config (and must not fail on one)
            return parse_config(parser, {}, req.passthrough)
        return parse_config(parser, check_config(conf), req.passthrough)

    # ------------------------------------------------------------------ entry point
    def main(self, argv: list[str] | None = None) -> int:
        """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
        args = list(sys.argv[1:] if argv is None else argv)
        debug = "--debug" in args
        args = [a for a in args if a != "--debug"]
        try:
            with warnings.catch_warnings():  # restores showwarning when main returns
                warnings.showwarning = _log_warning
                return self.dispatch(args)
        except SystemExit as exc:  # --help, --print_config, argparse
            code = exc.code
            return code if isinstance(code, int) else (0 if code is None else EXIT_USAGE)
        except KeyboardInterrupt as exc:  # RunInterrupted says where the results are
            print(f"{str(exc) or 'interrupted'}; continue the run with --resume", file=sys.stderr)
            return 128 + int(getattr(exc, "signum", 2))
        except Exception as exc:
            code, message = classify(exc)
            if debug:
                traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
            print(f"error: {message}", file=sys.stderr)
            if code != EXIT_USAGE and not debug:
                print("(run again with --debug for the traceback)", file=sys.stderr)
            return code

    def dispatch(self, args: list[str]) -> int:
        """``args`` without ``--debug``: the command's exit status (errors raise)."""
        commands = self.subcommands()
        if not args or args[0] in ("-h", "--help"):
            print(self.top_help(commands))
            return 0 if args else EXIT_USAGE
        if args[0] == "--version":
            from ..core.version import __version__

            print(f"{self.prog} {__version__}")
            return 0
        name, rest = args[0], args[1:]
        if name not in commands:
            close = difflib.get_close_matches(name, commands, n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            raise CLIError(None, f"unknown command {name!r}.{hint} Commands: {', '.join(commands)}")
        return commands[name].invoke(self, name, rest)

    def top_help(self, commands: dict[str, Command]) -> str:
        """``alchemi-lit --help``: the commands and examples."""
        width = max(9, *(len(n) for n in commands))
        p = self.prog
        lines = [
            f"usage: {self.prog} [--debug] {{{','.join(commands)}}} ...",
            "",
            self.description,
            "",
            "commands:",
            *(f"  {name:<{width}} {cmd.help}" for name, cmd in commands.items()),
            "",
            "options:",
            f"  -h, --help  show this help and exit (also: {self.prog} COMMAND --help)",
            "  --version   print the version and exit",
            "  --debug     show tracebacks of errors",
            "",
            "examples:",
            f"  {p} run --config configs/quickstart.yaml",
            f"  {p} run --config configs/quickstart.yaml \\",
            "      --simulator.stages.1.init_args.temperature 500",
            f"  {p} run --config configs/quickstart.yaml --print_config > my.yaml",
            f"  {p} validate --config my.yaml",
            f"  {p} run --simulator.stages.help FIRE",
            f"  {p} report results/quickstart.zarr --plots results/plots",
            f"  {p} elastic --config configs/workflows/elastic.yaml   # also: eos, phonons ...",
        ]
        return "\n".join(lines)


def _log_warning(
    message: Warning | str, category: type[Warning], *_args: Any, **_kwargs: Any
) -> None:
    """Python warnings (a StructureWarning about close atoms ...) go to the run's log,
    one line each, like everything else the CLI reports."""
    from loguru import logger

    logger.warning(f"{category.__name__}: {message}")


def main(argv: list[str] | None = None) -> int:
    """``alchemi-lit``'s entry point: :meth:`CLI.main` of the built-in :class:`CLI`."""
    return CLI().main(argv)
