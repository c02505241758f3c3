"""The command line of ``run`` / ``validate`` split into what each part is for.

``--config`` files and ``--key value`` overrides go to :mod:`.config` (applied in
order; ``--shard i/n`` is ``--data.shard i/n``); ``--resume [PATH]`` and
``--KEY.help [NAME]`` are alchemi-lit's own; help and
``--print_config`` pass through to jsonargparse.  jsonargparse cannot take the rest
itself: see :mod:`.config` for the keys it does not parse.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import CLIError


@dataclass
class Request:
    """A run / validate command line, split."""

    configs: list[str] = field(default_factory=list)
    overrides: list[tuple[str, str, bool]] = field(default_factory=list)  # key, raw value, append
    passthrough: list[str] = field(default_factory=list)  # handled by jsonargparse
    resume: str | bool | None = None  # --resume [PATH]
    help: tuple[str, str | None] | None = None  # --KEY.help [NAME]: (KEY, NAME)

    @property
    def help_only(self) -> bool:
        """Asks for help (``--help``, ``--KEY.help``): no config is needed or checked."""
        return any(
            t in ("-h", "--help") or t.split("=")[0].endswith(".help") for t in self.passthrough
        )


def split_argv(args: list[str]) -> Request:
    """``args`` (after ``alchemi-lit run``) as a :class:`Request`."""
    req = Request()
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
        if name == "shard":  # --shard i/n: data.shard (checked where the data is built)
            if not eq:
                if i + 1 >= len(args) or args[i + 1].startswith("--"):
                    raise CLIError("shard", "expected INDEX/COUNT after --shard, such as 0/4")
                value, i = args[i + 1], i + 1
            req.overrides.append(("data.shard", value, False))
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
    """``--KEY.help NAME``: jsonargparse's help takes class names, not registry names."""
    from ..core import registry

    entry = registry.find(value) if "." not in value else None
    return entry.import_path if entry is not None else value
