"""The package as a user installs it: the wheel and sdist build, and the wheel works alone.

Built from this checkout (the wheel from the sdist, as ``python -m build`` does, so a
file missing from the sdist fails here), installed with ``--no-deps`` into a fresh venv
that sees the system's packages (torch and the rest are not installed again), and run
from outside the checkout: ``alchemi-lit --help`` and the quickstart config.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(args: list, cwd: Path, env: dict, timeout: float = 600) -> str:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_wheel_installs_alone_and_runs_the_quickstart(tmp_path):
    # (find_spec of build.__main__, not an import of "build": palettable's wheel, which
    # pymatgen pulls in, leaves a build/lib folder in site-packages that imports as an
    # empty namespace package, and `python -m build` then fails instead of skipping)
    find = importlib.util.find_spec
    if find("build") is None or find("build.__main__") is None:
        pytest.skip("python -m build is not installed (pip install build)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the checkout
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "build", "--sdist", "--wheel", "--no-isolation", "--outdir",
         dist, ROOT], cwd=tmp_path, env=env)
    (wheel,) = dist.glob("alchemi_lit-*.whl")
    (sdist,) = dist.glob("alchemi_lit-*.tar.gz")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert any(n.endswith("licenses/LICENSE") or n.endswith("/LICENSE") for n in names)
    assert "alchemi_lit/cli/__init__.py" in names
    assert any(n.endswith("entry_points.txt") for n in names)
    with tarfile.open(sdist) as tf:
        assert any(n.endswith("/LICENSE") for n in tf.getnames())

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", venv], cwd=tmp_path, env=env)
    python = venv / "bin" / "python"
    run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], cwd=tmp_path,
        env=env)
    work = tmp_path / "work"
    shutil.copytree(ROOT / "configs", work / "configs")
    where = run([python, "-c", "import alchemi_lit; print(alchemi_lit.__file__)"], cwd=work,
                env=env)
    assert str(venv) in where, f"alchemi_lit imported from {where.strip()}, not the wheel"
    cli = venv / "bin" / "alchemi-lit"
    assert "usage: alchemi-lit" in run([cli, "--help"], cwd=work, env=env)
    out = run([cli, "run", "--config", "configs/quickstart.yaml"], cwd=work, env=env)
    assert "32 / 32" in out, out  # every crystal converged or completed
    assert (work / "results" / "quickstart.zarr").is_dir()
