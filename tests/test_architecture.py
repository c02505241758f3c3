"""The integrators' structure: the plugin contract and the built-in integrators stay small,
integrators never reach for a backend, and operations dispatch to the backend that
takes their inputs, else their torch reference."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import alchemi_lit
from alchemi_lit import kernels
from alchemi_lit.core import backends
from alchemi_lit.core import random as rng
from alchemi_lit.integrators import convergence, ops

PACKAGE = Path(alchemi_lit.__file__).parent
INTEGRATORS = ("fire", "fire2", "verlet", "langevin", "bussi", "berendsen", "nose_hoover")
INTEGRATORS += ("mtk", "crescale", "npt_langevin")


def imported_modules(path: Path, package: str) -> set[str]:
    """Every module ``path`` imports, relative imports resolved against ``package``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            out.add(module)
            out.update(f"{module}.{a.name}" for a in node.names)
    return out


def test_no_integrator_module_imports_or_names_the_kernels():
    for path in sorted((PACKAGE / "integrators").glob("*.py")):
        modules = imported_modules(path, "alchemi_lit.integrators")
        assert not any(m.startswith("alchemi_lit.kernels") for m in modules), path.name
        names = {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
        assert "kernels" not in names, path.name


def test_the_import_walk_sees_a_relative_kernels_import(tmp_path):
    """(The walk above would catch ``from .. import kernels`` in an integrator.)"""
    module = tmp_path / "mine.py"
    module.write_text("from .. import kernels\nfrom ..kernels import backend\n")
    found = imported_modules(module, "alchemi_lit.integrators")
    assert {"alchemi_lit.kernels", "alchemi_lit.kernels.backend"} <= found


def test_importing_the_integrators_and_core_does_not_import_the_kernels():
    """The backend sits above the integrators: it is loaded when a primitive first runs."""
    code = (
        "import sys, alchemi_lit.integrators, alchemi_lit.core.random\n"
        "import alchemi_lit.integrators.convergence\n"
        "assert 'alchemi_lit.kernels' not in sys.modules, 'kernels imported'\n"
        "import alchemi_lit.core.backends as b; b._load_builtin()\n"
        "assert 'alchemi_lit.kernels.backend' in sys.modules\n"
        "assert 'numba' not in sys.modules, 'numba imported before a kernel runs'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_module_sizes():
    """The base class is the plugin contract only; each built-in integrator stays short."""
    lines = {p: len(p.read_text().splitlines()) for p in (PACKAGE / "integrators").glob("*.py")}
    assert lines[PACKAGE / "integrators" / "base.py"] <= 150
    for name in INTEGRATORS:
        assert lines[PACKAGE / "integrators" / f"{name}.py"] <= 150, name
    for path in [*lines, *(PACKAGE / "kernels").glob("*.py"), PACKAGE / "core" / "backends.py"]:
        assert len(path.read_text().splitlines()) <= 400, path


def test_a_primitive_runs_the_backend_that_accepts_its_inputs():
    calls = []

    @backends.primitive
    def double(x: torch.Tensor) -> torch.Tensor:
        """Twice x."""
        calls.append("torch")
        return 2 * x

    assert double.__doc__ == "Twice x." and double.__name__ == "double"
    double.register("ints", lambda x: x.dtype == torch.int64)(lambda x: calls.append("ints"))
    double(torch.ones(2))
    double(torch.ones(2, dtype=torch.int64))
    assert calls == ["torch", "ints"]
    assert double.choose(torch.ones(2)) == "torch"
    double.register("ints", lambda x: False)(lambda x: calls.append("never"))  # replaced
    assert [i.backend for i in double.implementations] == ["ints"]
    assert double(torch.ones(1, dtype=torch.int64)).tolist() == [2]


@pytest.fixture
def batch():
    from alchemi_lit.core.state import Batch
    from conftest import perturbed_argon

    b = Batch.from_atoms(perturbed_argon(2, repeat=1, seed=0), dtype=torch.float64)
    b.forces = torch.ones_like(b.positions)
    return b


def test_the_cpu_kernels_are_registered_for_every_primitive(monkeypatch, batch):
    pytest.importorskip("numba")
    from alchemi_lit.core.segments import run_sums

    mask = torch.ones(2, dtype=torch.bool)
    stream = type("Stream", (), {"seed": 0, "compiled_kernels": False})()
    cases = {
        ops.kick: (batch, mask, 1.0),
        ops.kick_drift: (batch, mask, 1.0),
        ops.baoab_opening: (batch, mask, stream, 1.0, 0.1, 300.0),
        ops.bussi_opening: (batch, mask, stream, 1.0, 10.0, 300.0),
        ops.nhc_half_step: (batch, mask, torch.zeros(2, 3), torch.zeros(2, 3), 1.0, 300.0, 10.0),
        ops.fire_update: (batch, mask, torch.ones(2), torch.ones(2), torch.zeros(2)),
        ops.fire2_update: (batch, mask, torch.zeros(2, dtype=bool), torch.ones(2)),
        convergence.largest_force_below: (batch, 0.1),
        rng.atom_normals: ops.noise_keys(batch, 0, rng.PURPOSE_NOISE),
        run_sums: (batch.forces, batch.n_atoms),
    }
    for primitive, args in cases.items():
        assert primitive.choose(*args) == "numba", primitive
    monkeypatch.setattr(kernels, "ENABLED", False)
    for primitive, args in cases.items():
        assert primitive.choose(*args) == "torch", primitive
    monkeypatch.undo()
    batch.positions.requires_grad_(True)  # autograd: the torch reference
    assert ops.kick_drift.choose(batch, mask, 1.0) == "torch"


def test_integrator_names_have_one_import_path():
    """No alias of a never-released path (#42): the names live where they are defined."""
    from alchemi_lit.integrators import MDIntegrator, base, maxwell_boltzmann, md, velocities

    assert MDIntegrator is md.MDIntegrator and maxwell_boltzmann is velocities.maxwell_boltzmann
    for old in ("MDIntegrator", "maxwell_boltzmann", "system_sum", "_check_param", "as_param"):
        assert not hasattr(base, old), old
    assert base.Integrator.moving_atoms is ops.moving_atoms and base.Integrator.masked is ops.masked
