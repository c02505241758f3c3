"""scripts/requirements_met.py: the install scripts skip pip's resolution only when every
requirement, and everything it needs in turn, is installed within its range."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location(
        "requirements_met", ROOT / "scripts" / "requirements_met.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def fake_distribution(site: Path, name: str, requires: list[str]) -> None:
    """An installed distribution ``name`` 1.0 requiring ``requires`` (a dist-info only)."""
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", "Version: 1.0"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


def test_installed_requirements_within_their_ranges_are_met(check) -> None:
    assert check(["numpy>=1.0", "ase", "jsonargparse[signatures]>=4.0"]) == 0
    assert check([f"{ROOT / 'pyproject.toml'}[test]"]) == 0  # what make test installed
    assert check(['not-installed-anywhere-xyz; python_version < "3"']) == 0  # not for us


@pytest.mark.parametrize(
    "requirement", ["numpy<1", "not-installed-anywhere-xyz", "numpy>=1 and garbage"]
)
def test_a_missing_or_out_of_range_requirement_is_not_met(check, requirement) -> None:
    assert check(["ase", requirement]) == 1


def test_what_a_requirement_needs_is_checked_too_unless_alone(check, tmp_path, monkeypatch) -> None:
    fake_distribution(tmp_path, "alchemi-fake-top", ["alchemi-fake-middle>=1"])
    fake_distribution(tmp_path, "alchemi-fake-middle", [
        "numpy>=1", 'alchemi-fake-missing; extra == "more"', "alchemi-fake-gone>=2"])  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert check(["alchemi-fake-top"]) == 1  # alchemi-fake-gone, two levels down
    assert check(["--alone", "alchemi-fake-top"]) == 0
    fake_distribution(tmp_path, "alchemi-fake-gone", [])
    importlib.invalidate_caches()
    assert check(["alchemi-fake-gone>=2"]) == 1  # 1.0 is installed
    assert check(["alchemi-fake-top"]) == 1
    (tmp_path / "alchemi_fake_gone-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: alchemi-fake-gone\nVersion: 2.5\n"
    )
    assert check(["alchemi-fake-top"]) == 0
    assert check(["alchemi-fake-middle[more]"]) == 1  # its extra's requirement is missing
    assert "alchemi-fake-top" not in sys.modules
