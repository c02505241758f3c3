"""Contract checks for an integrator plugin, to run in the plugin's own test-suite.

The framework relies on a few promises every stage keeps (see
:class:`~alchemi_lit.integrators.Integrator`): systems outside the stage's mask are left
untouched bit for bit (several stages share one batch), a system's path does not
depend on the others in its batch (random numbers keyed per system, state in
per-system fields), the integrator pickles (pipelines send it to ranks), its state
survives a checkpoint, and a fused plan equals its stages run one after another.
:func:`check_integrator` runs each on small Lennard-Jones argon crystals and raises an
``AssertionError`` naming the broken promise::

    from alchemi_lit.testing import check_integrator

    def test_my_integrator_keeps_the_contract(tmp_path):
        check_integrator(lambda: MyIntegrator(dt=1.0, steps=20), tmp_path)
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..callbacks.checkpoint import Checkpoint
from ..core.state import Batch
from ..data import argon_crystals
from ..engine.fingerprint import settings
from ..engine.hooks import HookStageEnum, LambdaCallback
from ..integrators import FIRE
from ..models import LennardJones
from ..simulator import Simulator
from ..sinks import ZarrSink

#: the fields a run's results are compared on
COMPARED = ("positions", "velocities", "forces", "energy", "cell", "total_steps", "converged")


def argon(n_systems: int = 4, seed: int = 0) -> list[Any]:
    """Small, different, perturbed argon crystals (32 atoms each)."""
    return argon_crystals(n_systems=n_systems, repeat=2, noise=0.08, seed=seed)


def lennard_jones() -> LennardJones:
    return LennardJones(epsilon=0.0104, sigma=3.40, cutoff=6.0)


def check_integrator(
    make: Callable[[], Any],
    tmp_path: str | Path,
    model: Callable[[], Any] = lennard_jones,
    structures: Callable[[], list[Any]] = argon,
    dtype: torch.dtype = torch.float64,
) -> None:
    """Run every contract check on the integrator ``make()`` builds (a fresh one each
    time); ``tmp_path`` is a folder for checkpoints and stores."""
    tmp = Path(tmp_path)
    check_masked_systems_untouched(make(), model(), structures(), dtype)
    check_pickles(make())
    check_batch_independence(make, model, structures)
    check_checkpoint_round_trip(make, model, structures, tmp / "checkpoint")
    check_fused_equals_sequential(make, model, structures, tmp / "sequential")


def check_masked_systems_untouched(
    stage: Any, model: Any, structures: list[Any], dtype: torch.dtype = torch.float64
) -> None:
    """``pre_update``/``post_update`` with a mask leave every field of the other systems
    bit for bit as they were."""
    batch = Batch.from_atoms(structures, dtype=dtype)
    stage.setup(batch, seed=0, prefix="stage0")
    gen = torch.Generator().manual_seed(0)  # moving atoms everywhere: a write shows
    batch.velocities = 1e-3 * torch.randn(batch.velocities.shape, generator=gen, dtype=dtype)
    mask = torch.zeros(batch.num_systems, dtype=torch.bool)
    mask[::2] = True
    stage.init_systems(batch, mask)
    out = model(batch)
    batch.forces, batch.energy, batch.stress = out["forces"], out["energy"], out["stress"]
    before = {k: v.clone() for k, v in {**batch.atom, **batch.system}.items()}
    stage.pre_update(batch, mask)
    stage.post_update(batch, mask)
    others = ~mask
    for name, old in before.items():
        new = {**batch.atom, **batch.system}[name]
        rows = others if name in batch.system else batch.atom_mask(others)
        same = torch.equal(new[rows].nan_to_num(7.0), old[rows].nan_to_num(7.0))
        assert same, f"{type(stage).__name__} changed field {name!r} of systems outside its mask"


def check_pickles(stage: Any) -> None:
    """The integrator survives pickling (pipelines send it to ranks) unchanged."""
    copy = pickle.loads(pickle.dumps(stage))
    assert type(copy) is type(stage) and settings(copy) == settings(stage), (
        f"{type(stage).__name__} is not the same after pickling: {settings(copy)} "
        f"!= {settings(stage)}"
    )


def _run(plan: Any, model: Any, data: Any, **kw: Any) -> Any:
    return Simulator(model=model, stages=plan, seed=3, **kw).run(data)


def _assert_same(a: Batch, b: Batch, what: str) -> None:
    assert a.system_id.tolist() == b.system_id.tolist(), f"{what}: other systems"
    for key in COMPARED:
        x = {**a.atom, **a.system}[key]
        y = {**b.atom, **b.system}[key]
        assert torch.equal(x.nan_to_num(7.0), y.nan_to_num(7.0)), f"{what}: {key} differ"


def check_batch_independence(
    make: Callable[[], Any], model: Callable[[], Any], structures: Callable[[], list[Any]]
) -> None:
    """Each system ends exactly as it does in a batch with the others."""
    data = structures()
    together = _run(make(), model(), data).batch
    for k, atoms in enumerate(data):
        alone = _run(make(), model(), Batch.from_atoms([atoms], system_ids=[k])).batch
        _assert_same(alone, together.select([k]), f"system {k} alone vs in a batch")


def check_checkpoint_round_trip(
    make: Callable[[], Any],
    model: Callable[[], Any],
    structures: Callable[[], list[Any]],
    folder: Path,
) -> None:
    """Stopped mid-run and resumed from its checkpoint, a run ends as an uninterrupted
    one, bit for bit (the integrator's state travels in batch fields)."""
    data = structures()
    reference = _run(make(), model(), data).batch

    class Stop(Exception):
        pass

    def stop(ctx: Any) -> None:
        if ctx.step == 7:
            raise Stop

    cut = [Checkpoint(folder, every=5), LambdaCallback(HookStageEnum.AFTER_STEP, stop)]
    with contextlib.suppress(Stop):
        _run(make(), model(), data, callbacks=cut, sync_every=5)
    resumed = Simulator(
        model=model(), stages=make(), seed=3, sync_every=5, callbacks=[Checkpoint(folder)]
    ).run(data, resume=folder)
    _assert_same(reference, resumed.batch, "resumed from a checkpoint vs uninterrupted")


def check_fused_equals_sequential(
    make: Callable[[], Any],
    model: Callable[[], Any],
    structures: Callable[[], list[Any]],
    folder: Path,
) -> None:
    """``FIRE + stage`` in one fused run equals FIRE into a results store, then the
    stage from that store in a second run (noise keyed on the carried step count)."""
    data = structures()
    relax = lambda: FIRE(fmax=0.05, max_steps=15)  # noqa: E731
    fused = _run(relax() + make(), model(), data).batch
    store = folder / "relaxed.zarr"
    _run(relax(), model(), data, sinks=[ZarrSink(store, mode="w")])
    sequential = _run(make(), model(), str(store)).batch
    for key in ("positions", "velocities", "energy", "total_steps"):
        x = {**fused.atom, **fused.system}[key]
        y = {**sequential.atom, **sequential.system}[key]
        assert np.array_equal(x.numpy(), y.numpy(), equal_nan=True), (
            f"fused FIRE + stage vs the two runs one after another: {key} differ"
        )
