"""A command of ``alchemi-lit``: what :meth:`CLI.subcommands` maps a name to.

A command declares its options on a jsonargparse parser (:meth:`Command.add_arguments`)
and acts on the parsed namespace (:meth:`Command.execute`); parse errors become one
line naming the option, exit status 2, like every other user error.  ``run`` and
``validate`` replace :meth:`Command.invoke` itself: their option keys address list
items by index, which jsonargparse does not parse (see :mod:`.config`).
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from .errors import CLIError, one_line

if TYPE_CHECKING:
    from .app import CLI


class Command(ABC):
    """One ``alchemi-lit NAME ...`` command.  Subclass it, set :attr:`help`, declare the
    options in :meth:`add_arguments` and do the work in :meth:`execute`."""

    #: one line: the command list of ``alchemi-lit --help`` and the command's own help
    help: str = ""

    def add_arguments(self, parser: Any) -> None:
        """Declare the command's options on ``parser`` (a jsonargparse ArgumentParser);
        a command without options keeps this default, which declares none."""
        return None

    @abstractmethod
    def execute(self, cli: CLI, cfg: Any) -> int:
        """Do the work with the parsed options ``cfg``; return the exit status."""

    def invoke(self, cli: CLI, name: str, args: list[str]) -> int:
        """Parse ``args`` (what follows ``alchemi-lit NAME``) and execute."""
        from jsonargparse import ArgumentError, ArgumentParser

        parser = ArgumentParser(
            prog=f"{cli.prog} {name}", description=self.help, exit_on_error=False
        )
        self.add_arguments(parser)
        try:
            cfg = parser.parse_args(args)
        except ArgumentError as exc:
            raise CLIError(name, one_line(str(exc))) from None  # argparse's own words
        return self.execute(cli, cfg)


def console_width() -> int | None:
    """Rich's width: the terminal's, else 120 (captured output, pipes)."""
    return None if sys.stdout.isatty() else 120
