"""User errors of the command line: one line naming the key, exit status 2.

:class:`CLIError` is what every check raises; :func:`classify` turns any exception into
the exit status and the one line ``main`` prints.  jsonargparse reports type errors as
text only (``ArgumentError(None, message)``: no key, no expected type), and that text
changes between releases.  So nothing here reads it: the checks find the key a parse
error is about by parsing one parameter at a time (:mod:`.names`) or leaving one key
out at a time (:mod:`.config`), and say what was expected from our own signatures
(:func:`describe_type`).  jsonargparse's words are shown only when no single key
explains the error (:func:`unexplained`).
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from typing import Any

EXIT_USAGE = 2


class CLIError(Exception):
    """A user error: printed as one line naming ``key``, exit status 2."""

    def __init__(self, key: str | None, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}" if key else message)


def one_line(text: str) -> str:
    return " ".join(text.split())


def classify(exc: BaseException) -> tuple[int, str]:
    """Exit status and one-line message for an exception."""
    from ..core.errors import AlchemiError

    if isinstance(exc, CLIError):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, (AlchemiError, ValueError, FileNotFoundError, FileExistsError)):
        return EXIT_USAGE, one_line(str(exc))
    from argparse import ArgumentError  # what jsonargparse raises

    if isinstance(exc, ArgumentError):
        return EXIT_USAGE, one_line(str(exc))
    return 1, f"unexpected {type(exc).__name__}: {one_line(str(exc))}"


def key_for(exc: BaseException, prefix: str, names: list[str], fallback: str) -> str:
    """The parameter one of our own constructors' error messages is about: the one of
    ``names`` it mentions, if only one is mentioned; otherwise ``fallback`` (the
    object's own key)."""
    text = re.sub(r"^\w+:\s*", "", str(exc))  # "FIRE: fmax ..." -> "fmax ..."
    found = [n for n in names if re.search(rf"(?<![\w.]){re.escape(n)}(?![\w])", text)]
    if len(found) > 1:  # "devices=2 ... use strategy 'replicas'": the one given a value
        found = [n for n in found if re.search(rf"(?<![\w.]){re.escape(n)}=(?!=)", text)]
    return f"{prefix}.{found[0]}" if len(found) == 1 else fallback


def describe_type(annotation: Any) -> str:
    """A parameter's annotation as the reader wrote it: ``float``, ``one of 'ase',
    'mass_weighted'``, ``int or null``.  Reads our own signatures, never a parser's text."""
    if annotation is inspect.Parameter.empty:
        return "the parameter's type"
    if isinstance(annotation, str):
        text = annotation
    else:
        text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    text = re.sub(r"<class '([\w.]+)'>", lambda m: m.group(1).rsplit(".", 1)[-1], text)
    text = re.sub(r"\b(?:typing|collections\.abc|torch)\.", "", text)
    text = re.sub(r"\bOptional\[(.*)\]$", r"\1 | None", text)
    parts = [p.strip() for p in _split_union(text)]
    names = []
    for part in parts:
        literal = re.fullmatch(r"Literal\[(.*)\]", part)
        name = "null" if part == "None" else part
        names.append(f"one of {literal.group(1)}" if literal else name)
    return " or ".join(names)


def annotation_of(owner: Any, name: str) -> Any:
    """The annotation of parameter ``name`` of ``owner`` (a class, dataclass or function)
    as written, with the aliases of a closed choice (``Precision``) spelt out."""
    import dataclasses
    import sys

    plain = dataclasses.is_dataclass(owner) or not isinstance(owner, type)
    target = owner if plain else owner.__init__
    if dataclasses.is_dataclass(owner):
        written = {f.name: f.type for f in dataclasses.fields(owner)}.get(name)
    else:
        try:
            param = inspect.signature(target).parameters.get(name)
        except (TypeError, ValueError):
            param = None
        written = None if param is None else param.annotation
    if written is None:
        return inspect.Parameter.empty
    if not isinstance(written, str):
        return written
    namespace = vars(sys.modules.get(getattr(target, "__module__", ""), object))

    def spelt(m: re.Match[str]) -> str:
        alias = namespace.get(m.group())
        return _spelt(alias) if typing.get_origin(alias) in _ALIASED else m.group()

    return re.sub(r"\b[A-Z]\w*\b", spelt, written)


_ALIASED = (typing.Literal, typing.Union, types.UnionType)


def _spelt(hint: Any) -> str:
    """A resolved hint written as a signature writes it (``float | Tensor``)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_spelt(h) for h in typing.get_args(hint))
    if hint is type(None):
        return "None"
    return hint.__name__ if isinstance(hint, type) else str(hint)


def _split_union(text: str) -> list[str]:
    """``a | b[c | d]`` -> ``["a", "b[c | d]"]`` (only the top level's bars)."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += 1 if char in "[(" else -1 if char in "])" else 0
        if char == "|" and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


def rejected(key: str, value: Any, annotation: Any) -> CLIError:
    """The error for a value the parser refused at ``key``: what was expected (from our
    signature) and what was given."""
    return CLIError(key, f"expected {describe_type(annotation)}, got {value!r}")


def unexplained(exc: BaseException, where: str) -> CLIError:
    """A parse error no single key explains: jsonargparse's own words, on one line."""
    return CLIError(where or None, one_line(str(exc)))
