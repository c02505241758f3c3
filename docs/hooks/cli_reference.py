"""mkdocs hook: the CLI reference, the parser's own ``--help`` of every command.

Generated at build time from :class:`alchemi_lit.cli.CLI` (the class the console
script runs), so the page cannot drift from the parser.
"""

from __future__ import annotations

import contextlib
import io

from mkdocs.structure.files import File


def help_text(args: list[str]) -> str:
    """What ``alchemi-lit ARGS`` prints (help exits through SystemExit)."""
    from alchemi_lit.cli import CLI

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        CLI().main(args)
    return out.getvalue().rstrip()


def commands() -> list[str]:
    """The subcommands, as the CLI class declares them."""
    from alchemi_lit.cli import CLI

    return list(CLI().subcommands())


def page() -> str:
    """The markdown of the CLI reference page."""
    lines = [
        "# Command line reference",
        "",
        "Generated at build time from the parser (`alchemi-lit COMMAND --help`). "
        "Per-class help: `alchemi-lit run --simulator.stages.help FIRE`.",
        "",
        "## `alchemi-lit`",
        "",
        "```text",
        help_text(["--help"]),
        "```",
    ]
    for command in commands():
        lines += ["", f"## `alchemi-lit {command}`", "", "```text",
                  help_text([command, "--help"]), "```"]
    return "\n".join(lines) + "\n"


def on_files(files, config):
    """Add the generated CLI page."""
    files.append(File.generated(config, "reference/command-line.md", content=page()))
    return files
