"""The command line's errors never depend on jsonargparse's wording (#42).

jsonargparse reports a refused value as text only, and rewords it between releases.
Here every message it raises is replaced by one no release has written: the errors
must still name the key and the type our own signature expects, so no pin on
jsonargparse's releases is needed for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonargparse
import pytest

from alchemi_lit.cli import main

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
REWORDED = "a future jsonargparse says this in words nobody parses"


@pytest.fixture
def reworded(monkeypatch: pytest.MonkeyPatch) -> None:
    """jsonargparse with every ArgumentError's message replaced."""
    for name in ("parse_args", "parse_object"):
        original = getattr(jsonargparse.ArgumentParser, name)

        def wrapped(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            try:
                return _original(self, *args, **kwargs)
            except jsonargparse.ArgumentError:
                raise jsonargparse.ArgumentError(None, REWORDED) from None

        monkeypatch.setattr(jsonargparse.ArgumentParser, name, wrapped)


CASES = {
    "integrator parameter": (
        ["--simulator.stages.0.init_args.fmax", "abc"],
        "simulator.stages.0.init_args.fmax: expected float, got 'abc'",
    ),
    "closed choice": (
        ["--simulator.stages.0.init_args.mode", "asx"],
        "simulator.stages.0.init_args.mode: expected one of 'ase', 'mass_weighted', got 'asx'",
    ),
    "an alias of a Literal": (
        ["--simulator.precision", "65"],
        "simulator.precision: expected one of '64', '32', '64-true', '32-true', got '65'",
    ),
    "a data field": (
        ["--data.partial_occupancy", "maybe"],
        "data.partial_occupancy: expected one of 'error', 'majority', got 'maybe'",
    ),
    "an output field": (
        ["--output.save_config", "maybe"],
        "output.save_config: expected bool, got 'maybe'",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_errors_name_the_key_whatever_jsonargparse_says(
    case: str, reworded: None, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides, message = CASES[case]
    assert main(["validate", "--config", str(QUICKSTART), *overrides]) == 2
    err = capsys.readouterr().err
    assert f"error: {message}" in err, err
    assert REWORDED not in err


def test_the_same_errors_with_jsonargparse_s_own_words(capsys: pytest.CaptureFixture[str]) -> None:
    """Without the rewording the messages are the same: they never came from its text."""
    overrides, message = CASES["integrator parameter"]
    assert main(["validate", "--config", str(QUICKSTART), *overrides]) == 2
    assert f"error: {message}" in capsys.readouterr().err


def test_an_error_no_key_explains_shows_jsonargparse_s_words(
    reworded: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command's own options (argparse's words, after the command's name)."""
    assert main(["merge"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: merge: {REWORDED}"), err
