"""Timing figures stay out of the code (issue #19 part 8).

Docstrings and comments say *why* a choice was made ("one compiled pass instead of a few
dozen torch operations, each of which runs cold right after the model's forward"); the
figures behind it live in BENCHMARKS.md (or docs/design/), with the machine, the date
and the command that measured them, where they can be re-measured and kept true.  A
figure in a docstring goes stale silently.

This scans every docstring and comment of ``alchemi_lit/`` and of the plugins'
``alchemi_lit_*`` packages for times (``5 µs``, ``0.7 ms``, ``~5 s once``, ``2 s a
step``) and speed-ups (``3x faster``, ``2.6x``, ``3 times slower``, ``20 % faster``).
Numbers that are not timings -- sizes that define a format (``64 KiB``), shapes
(``6x6``, ``3 x 3``), thresholds, units -- do not match.  Strings in code (error and log
messages) are not docstrings and are not scanned.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = [ROOT / "alchemi_lit", *sorted((ROOT / "plugins").glob("*/alchemi_lit_*"))]

#: files exempt from the check (a path ending in "/" covers a folder); empty since every
#: branch that was open when the check landed has been swept
ALLOWLIST: tuple[str, ...] = ()

_NUM = r"(?<![\w.])\d+(?:[.,]\d+)*"
#: a measured time or speed-up, as written in prose
TIMING = re.compile(
    "|".join(
        (
            rf"{_NUM}\s?(?:µs|us|ms|ns)\b",  # 5 µs, 0.7 ms, 6.6 ns
            rf"{_NUM}\s?s\b(?=\s*(?:(?:a|an|per|each|once|then|to)\b|->|[,;:)]))",  # 5 s once
            rf"{_NUM}\s?x\b(?=\s*(?:(?:faster|slower|cheaper|dearer|more|less|the|as|one)\b"
            r"|[,;:)]|$))",  # 3x faster, (2.6x), 2.7x the scalar loop
            rf"{_NUM}\s?times\s+(?:faster|slower|cheaper|dearer|as\s+(?:fast|slow))",
            rf"{_NUM}\s?%\s+(?:faster|slower|cheaper|dearer|less\s+time|more\s+time)",
        )
    ),
    re.IGNORECASE | re.MULTILINE,
)


def prose(source: str) -> list[tuple[int, str]]:
    """``(first line, text)`` of every comment and docstring -- any string that is a
    statement of its own: module, class, function and attribute docstrings -- read
    with ``tokenize`` alone (an ``ast`` pass as well would double the scan's time)."""
    out: list[tuple[int, str]] = []
    statement_start, pending = True, None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
        elif tok.type == tokenize.NEWLINE:
            if pending is not None:
                out.append(pending)
            statement_start, pending = True, None
        elif tok.type in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
            continue
        else:
            single = statement_start and tok.type == tokenize.STRING
            pending = (tok.start[0], tok.string) if single else None
            statement_start = False
    return out


def timing_figures(source: str) -> list[tuple[int, str]]:
    """``(line, matched text)`` of every timing figure in ``source``'s prose; a figure
    in a docstring is reported on its own line (docstrings are not re-indented, so line
    ``k`` of the text is line ``first + k`` of the file)."""
    found = []
    for first, text in prose(source):
        for m in TIMING.finditer(text):
            found.append((first + text.count("\n", 0, m.start()), m.group().strip()))
    return sorted(found)


def allowed(rel: str) -> bool:
    return any(rel == a or (a.endswith("/") and rel.startswith(a)) for a in ALLOWLIST)


def test_no_timing_figures_in_docstrings_or_comments():
    offenders = []
    for root in SOURCE_ROOTS:
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if allowed(rel):
                continue
            for line, figure in timing_figures(path.read_text(encoding="utf-8")):
                offenders.append(f"{rel}:{line}: {figure!r}")
    assert not offenders, (
        "timing figures in docstrings or comments -- say why in words and move the figure "
        "to BENCHMARKS.md (or docs/design/) with what was measured, on what, and the "
        "command:\n  " + "\n  ".join(offenders)
    )


PLANTED = '''"""A module.

Why: one call instead of thirty; it costs ~5 µs (47 us warm).
"""

X = 1  # a gather here: 3x faster than [idx]

#: compiled on first use: ~5 s once, then 0.7 s per process
Y = 2


def f():
    """Quick: 2.6x, and 3 times faster than before; 20 % faster too."""
    return 0.37  # ms? no: 0.37 ms a draw
'''

CLEAN = '''"""Sizes and shapes are not timings: 64 KiB per message by default, a 6x6 block,
``[P, 3, 3]``, 64 x 108 argon atoms, 2 fs steps, rc 8.5 Å, 1 % strain, 48 atoms,
0x5BD1E995, e3nn 0.4.x, every 10 steps, 30 s of history, 2 s apart, 4 x 32 Cu, 2x2x2
supercells; and "measured" alone is a word."""

MESSAGE = "took 5 ms"  # code, not prose: error and log messages are not scanned
'''


def test_planted_figures_are_found_and_sizes_are_not():
    found = timing_figures(PLANTED)
    assert [line for line, _ in found] == [3, 3, 6, 8, 8, 13, 13, 13, 14], found
    assert [fig for _, fig in found] == [
        "47 us", "5 µs", "3x", "0.7 s", "5 s", "2.6x", "20 % faster", "3 times faster", "0.37 ms"
    ]  # fmt: skip
    assert timing_figures(CLEAN) == []
