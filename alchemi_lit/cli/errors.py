"""User errors of the command line: one line naming the key, exit status 2.

:class:`CLIError` is what every check raises; :func:`classify` turns any exception into
the exit status and the one line ``main`` prints.  jsonargparse 4.53 reports type errors
as text only (``ArgumentError(None, message)``, no key or expected type as attributes),
so :func:`explain_jsonargparse` is the one place that reads that text; pyproject.toml
pins the jsonargparse releases it was tested with.
"""

from __future__ import annotations

import re

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
        return EXIT_USAGE, explain_jsonargparse(str(exc), "")
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


def explain_jsonargparse(msg: str, prefix: str, owner: str | None = None) -> str:
    """One line out of a jsonargparse error message, naming the full key (``prefix`` +
    the key jsonargparse names).  The only reader of jsonargparse's message text: keep
    it in step with the jsonargparse range pinned in pyproject.toml."""

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
    union = re.search(r"Subtypes: \[(.*)\]", text)
    given = re.search(r"Given value: (.*)", text)
    if "Does not validate against any of the Union subtypes" in text and union and given:
        types = re.findall(r"typing\.Literal\[[^\]]*\]|<class '[\w.]+'>", union.group(1))
        names = [_type_name(t.strip()) for t in types]
        if any(n.startswith("one of ") for n in names):  # Optional[Literal]: None = default
            names = [n for n in names if n != "NoneType"]
            return f"{key}: expected {' or '.join(names)}, got {given.group(1).strip()!r}"
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
    body = "; ".join(dict.fromkeys(detail)) or one_line(text)
    return f"{key}: {body[:400]}"


def _type_name(text: str) -> str:
    text = re.sub(r"<class '([\w.]+)'>", lambda m: m.group(1).rsplit(".", 1)[-1], text)
    m = re.fullmatch(r"typing\.Literal\[(.*)\]", text)
    if m:
        return f"one of {m.group(1)}"
    return text.replace("typing.", "").replace("collections.abc.", "")
