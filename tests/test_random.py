"""Counter-based random numbers: the Philox bijection and the per-atom normal draws."""

from __future__ import annotations

import pytest
import torch

from alchemi_lit.core import random as rng

# Random123 known-answer vectors for Philox4x32-10 (counter, key, result).
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def _t(*values: int) -> list[torch.Tensor]:
    return [torch.tensor([v], dtype=torch.int64) for v in values]


@pytest.mark.parametrize(("counter", "key", "expected"), KAT)
def test_philox_matches_random123_known_answers(counter, key, expected):
    out = rng.philox4x32(*_t(*counter), *_t(*key))
    assert [int(x) for x in out] == list(expected)


def test_atom_normals_are_standard_normal_and_keyed_per_system():
    n_sys, per = 50, 200
    system_idx = torch.arange(n_sys).repeat_interleave(per)
    ptr = torch.arange(n_sys + 1) * per
    system_id = torch.arange(n_sys, dtype=torch.int64) * 7919 + 3
    step = torch.full((n_sys,), 12, dtype=torch.int64)
    local = rng.local_atom_index(system_idx, ptr)
    z = rng.atom_normals(0, system_id, step, system_idx, local, rng.PURPOSE_NOISE, torch.float64)
    assert z.shape == (n_sys * per, 3)
    assert abs(float(z.mean())) < 0.02  # 30k samples: standard error 0.006
    assert abs(float(z.var()) - 1.0) < 0.03
    corr = torch.corrcoef(z.T)
    assert (corr - torch.eye(3)).abs().max() < 0.03
    # one system alone draws what it draws inside the batch
    rows = slice(10 * per, 11 * per)
    alone = rng.atom_normals(
        0, system_id[10:11], step[10:11], torch.zeros(per, dtype=torch.long),
        torch.arange(per), rng.PURPOSE_NOISE, torch.float64,
    )  # fmt: skip
    assert torch.equal(alone, z[rows])
    # another step, seed or purpose gives other numbers
    other = rng.atom_normals(0, system_id, step + 1, system_idx, local, 1, torch.float64)
    assert not torch.equal(other, z)
    reseeded = rng.atom_normals(1, system_id, step, system_idx, local, 1, torch.float64)
    assert not torch.equal(reseeded, z)
    velocity = rng.atom_normals(0, system_id, step, system_idx, local, 2, torch.float64)
    assert not torch.equal(velocity, z)


def test_normals_drawn_ahead_are_exactly_the_keyed_draws():
    """NormalsAhead serves several steps from one draw: every value must equal a fresh
    atom_normals call, whether systems advance together, one is frozen, the draw runs
    out, or the layout changes."""
    from alchemi_lit.core.random import NormalsAhead, atom_normals

    sizes = [5, 12, 1, 30]
    sys_idx = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    local = torch.cat([torch.arange(n) for n in sizes])
    ids = torch.tensor([7, 3, 11, 2**40 + 5])
    ahead = NormalsAhead()
    step = torch.tensor([0, 4, 9, 100])
    for k in range(2 * NormalsAhead.MAX_AHEAD + 3):
        if k % 5 == 4:
            step = step + torch.tensor([1, 0, 1, 1])  # system 1 frozen this step
        else:
            step = step + 1
        for purpose in (rng.PURPOSE_NOISE, rng.PURPOSE_THERMOSTAT):  # kept apart
            got = ahead(9, ids, step, sys_idx, local, purpose, torch.float64)
            want = atom_normals(9, ids, step, sys_idx, local, purpose, torch.float64)
            assert torch.equal(got, want), (k, purpose)
    # another seed on the same layout (a stage set up again) draws afresh
    got = ahead(10, ids, step, sys_idx, local, rng.PURPOSE_NOISE, torch.float64)
    assert torch.equal(got, atom_normals(10, ids, step, sys_idx, local, 1, torch.float64))
    # a new layout (other tensors) draws afresh
    other = torch.tensor([1, 2])
    idx2 = torch.cat([torch.zeros(3, dtype=torch.long), torch.ones(2, dtype=torch.long)])
    local2 = torch.tensor([0, 1, 2, 0, 1])
    step2 = torch.tensor([5, 6])
    got = ahead(9, other, step2, idx2, local2, 1, torch.float64)
    assert torch.equal(got, atom_normals(9, other, step2, idx2, local2, 1, torch.float64))


def test_normals_ahead_adapts_how_far_it_draws(monkeypatch):
    """A batch whose layout changes every step (refills at every bookkeeping) gets
    one- or two-step draws instead of eight-step ones it throws away; a stable layout
    goes back to drawing ahead.  The numbers stay the keyed draws throughout."""
    from alchemi_lit.core import random as random_mod

    drawn = []  # atoms x steps of each draw NormalsAhead makes
    keyed = random_mod.atom_normals

    def counting(*args, ahead=1):
        drawn.append(int(args[3].shape[0]) * ahead)
        return keyed(*args, ahead=ahead)

    monkeypatch.setattr(random_mod, "atom_normals", counting)
    ahead = random_mod.NormalsAhead()
    ids, step = torch.tensor([4, 9]), torch.tensor([0, 3])
    for k in range(12):
        if k <= 6:  # new tensors: a new layout, as after a refill
            idx = torch.cat([torch.zeros(4, dtype=torch.long), torch.ones(6, dtype=torch.long)])
            local = torch.cat([torch.arange(4), torch.arange(6)])
        got = ahead(1, ids, step + k, idx, local, 2, torch.float64)
        assert torch.equal(got, keyed(1, ids, step + k, idx, local, 2, torch.float64)), k
    steps_per_draw = [d // 10 for d in drawn]
    # 8 at first; dropped after one step: 1, used up: 2, ...; stable from k = 6: 2, 4
    assert steps_per_draw == [8, 1, 2, 1, 2, 1, 2, 4]


def test_integrators_pickle_without_drawn_numbers():
    import pickle

    from alchemi_lit.integrators import Langevin
    from alchemi_lit.integrators.noise import noise_source

    stage = Langevin(dt=1.0, temperature=300.0, steps=5)
    source = noise_source(stage)
    assert noise_source(stage) is source  # one per integrator, kept outside it
    assert noise_source(Langevin(dt=1.0, temperature=300.0, steps=5)) is not source
    copy = pickle.loads(pickle.dumps(stage))
    assert not any(isinstance(v, rng.NormalsAhead) for v in vars(copy).values())
    assert noise_source(copy) is not source


def test_system_uniforms_are_uniform_and_keyed_per_system():
    """A Monte Carlo move's draws: on (0, 1), one row per system that depends only on its
    key (the same row in any batch, another one at the next step or purpose)."""
    ids = torch.arange(4000, dtype=torch.int64)
    step = torch.full_like(ids, 7)
    u = rng.system_uniforms(3, ids, step, rng.PURPOSE_MC)
    assert u.shape == (4000, 4) and u.dtype == torch.float64
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 4 * (1 / 12 / u.numel()) ** 0.5
    assert abs(float(torch.corrcoef(u.T)[0, 1])) < 4 / 4000**0.5  # words independent
    some = torch.tensor([4, 999, 17])
    alone = rng.system_uniforms(3, some, step[:3], rng.PURPOSE_MC)
    assert torch.equal(alone, u[some])
    later = rng.system_uniforms(3, some, step[:3] + 1, rng.PURPOSE_MC)
    other = rng.system_uniforms(3, some, step[:3], rng.PURPOSE_NOISE)
    assert not (later == alone).any() and not (other == alone).any()
