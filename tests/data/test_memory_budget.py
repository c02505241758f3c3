"""``SizeAwareSampler(max_atoms="auto")``: budgets measured from the model's memory.

A reader that answers with a known law (``a + b atoms + c edges`` of the batch the
model just evaluated) checks the probing, the fit and the budget against the analytic
answer; the real CPU reader then sizes a real run, whose batches never exceed the
budget and whose budget-sized batch, measured, fits the memory it was sized for.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zarr
from ase.build import bulk

import alchemi_lit as al
from alchemi_lit.core.errors import ConfigError
from alchemi_lit.data import SizeAwareSampler, argon_crystals, mixed_argon
from alchemi_lit.data.memory import MemoryReader, ProcessMemoryReader
from alchemi_lit.engine.memory_probe import MemoryProbe
from alchemi_lit.integrators import FIRE
from alchemi_lit.models import LennardJones
from alchemi_lit.sinks import ZarrSink

CUTOFF, SKIN = 5.0, 1.0
MiB = 2**20


class Recording(LennardJones):
    """Argon LJ that records (atoms, edges) of every batch it evaluates."""

    def __init__(self, cutoff: float = CUTOFF) -> None:
        super().__init__(0.0104, 3.40, cutoff=cutoff, skin=SKIN)
        self.seen: list[tuple[int, int]] = []

    def energy_and_edge_gradient(self, batch, edges):  # type: ignore[no-untyped-def]
        self.seen.append((int(batch.num_atoms), int(edges.i.shape[0])))
        return super().energy_and_edge_gradient(batch, edges)


class LawReader(MemoryReader):
    """A device whose peak grows by ``a + b atoms + c edges`` of the last evaluation."""

    name = "law"
    resolution = 1

    def __init__(self, model: Recording, a: float, b: float, c: float, free: int) -> None:
        self.model, self.law, self.free = model, (a, b, c), free
        self.readings: list[tuple[int, int]] = []  # (atoms, edges) the model saw

    def start(self) -> None:
        self.model.seen.clear()

    def peak_growth(self) -> int:
        self.readings += self.model.seen
        return max(self.peak_growth_of(n, e) for n, e in self.model.seen)

    def peak_growth_of(self, n: int, e: int) -> int:
        a, b, c = self.law
        return round(a + b * n + c * e)

    def available(self) -> int:
        return self.free


def cpu_probe(model: Recording) -> MemoryProbe:
    return MemoryProbe(model, torch.float64, torch.device("cpu"), stress=False)


def measured(data, reader: MemoryReader, model: Recording, **kw) -> SizeAwareSampler:  # type: ignore[no-untyped-def]
    sampler = SizeAwareSampler(data, max_atoms="auto", memory_reader=reader, **kw)
    sampler.bind(CUTOFF + SKIN, cpu_probe(model))
    return sampler


def analytic(sampler: SizeAwareSampler, a: float, b: float, c: float, usable: float):  # type: ignore[no-untyped-def]
    """The budgets that put a full batch at ``usable``, split at the mean density."""
    n, e = sampler.sizes.astype(float), sampler.edges.astype(float)
    rho = e.sum() / n.sum()
    atoms = (usable - a) / (b + c * rho)
    return min(int(atoms), int(n.sum())), min(int(rho * atoms), int(e.sum()))


def test_a_known_law_is_recovered_and_gives_the_analytic_budget():
    model = Recording()
    data = mixed_argon(n_systems=40, max_atoms=120, seed=3)  # clusters and crystals
    a, b, c, free = 0.5 * MiB, 2048.0, 300.0, 16 * MiB
    reader = LawReader(model, a, b, c, free)
    sampler = measured(data, reader, model, memory_fraction=0.5)
    fit = sampler.memory_fit
    assert fit["law"] == "atoms+edges" and fit["reader"] == "law"
    assert fit["intercept"] == pytest.approx(a, rel=1e-6)
    assert fit["per_atom"] == pytest.approx(b, rel=1e-6)
    assert fit["per_edge"] == pytest.approx(c, rel=1e-6)
    # the probes' counts are what the model saw; they stayed within a quarter of the memory
    assert [tuple(p[:2]) for p in fit["probes"]] == reader.readings[::2]  # (each read twice)
    assert max(p[2] for p in fit["probes"]) <= 0.25 * 0.5 * free
    atoms, edges = analytic(sampler, a, b, c, 0.5 * free)
    assert (sampler.max_atoms, sampler.max_edges) == (atoms, edges)
    assert atoms < sampler.sizes.sum()  # the memory, not the dataset, set it
    assert sampler.budget() == (atoms, 1 << 62, edges)
    assert a + b * atoms + c * edges <= 0.5 * free < a + b * (atoms + 1) + c * (edges + 1)


def test_probe_edge_counts_are_the_models():
    """The sampler's per-system pair counts (which the fit and budgets use) are the
    pairs the model's own neighbour list builds."""
    model = Recording()
    data = mixed_argon(n_systems=12, max_atoms=80, seed=1)
    sampler = measured(data, LawReader(model, 0, 1000.0, 50.0, 32 * MiB), model)
    model.seen.clear()
    cpu_probe(model)(data)
    assert model.seen == [(int(sampler.sizes.sum()), int(sampler.edges.sum()))]


def test_probes_without_density_spread_fit_per_atom():
    """Identical crystals: edges per atom hardly vary, so edges cannot be told from
    atoms; the law is per atom (at the data's own density) and no edge budget is set."""
    model = Recording()
    data = argon_crystals(n_systems=40, repeat=2, seed=5)
    a, b, c, free = 1 * MiB, 2048.0, 300.0, 48 * MiB
    sampler = measured(data, LawReader(model, a, b, c, free), model)
    fit = sampler.memory_fit
    assert fit["law"] == "atoms" and "fitted per atom" in fit["note"]
    rho = sampler_density(data)
    assert fit["per_edge"] == 0.0
    assert fit["per_atom"] == pytest.approx(b + c * rho, rel=0.01)
    assert fit["intercept"] == pytest.approx(a, rel=0.05)
    assert sampler.max_edges is None and sampler.budget()[2] is None
    expected = int((0.8 * free - fit["intercept"]) / fit["per_atom"])
    assert sampler.max_atoms == min(expected, int(sampler.sizes.sum()))


def count_pairs_of(data, radius: float = CUTOFF + SKIN) -> int:  # type: ignore[no-untyped-def]
    from alchemi_lit.models.neighbors import count_pairs

    return sum(count_pairs(x.positions, x.cell.array, x.pbc, radius) for x in data)


def sampler_density(data) -> float:  # type: ignore[no-untyped-def]
    return count_pairs_of(data) / sum(len(x) for x in data)


def test_the_whole_dataset_is_the_ceiling():
    model = Recording()
    data = mixed_argon(n_systems=10, max_atoms=60, seed=2)
    sampler = measured(data, LawReader(model, MiB, 1000.0, 100.0, 1 << 40), model)
    assert sampler.max_atoms == int(sampler.sizes.sum())
    assert sampler.max_edges in (None, int(sampler.edges.sum()))


def test_a_caller_max_edges_caps_the_measured_one():
    model = Recording()
    data = mixed_argon(n_systems=40, max_atoms=120, seed=3)
    reader = LawReader(model, 3 * MiB, 2048.0, 300.0, 64 * MiB)
    free_choice = measured(data, reader, model).max_edges
    capped = measured(data, reader, model, max_edges=free_choice // 2)
    assert capped.max_edges == free_choice // 2


def test_a_system_that_alone_exceeds_the_memory_is_named():
    model = Recording()
    data = mixed_argon(n_systems=30, min_atoms=8, max_atoms=200, seed=4)
    biggest = int(np.argmax([len(x) for x in data]))
    reader = LawReader(model, 0.0, 10240.0, 0.0, int(1.5 * MiB / 0.8))
    with pytest.raises(ConfigError, match=rf"system {biggest} \(\d+ atoms.*alone needs 2 MiB"):
        measured(data, reader, model)


def test_a_model_whose_memory_is_not_seen_cannot_be_probed():
    model = Recording()
    reader = LawReader(model, 0.0, 0.0, 0.0, 64 * MiB)
    reader.resolution = MiB
    data = mixed_argon(n_systems=100, max_atoms=100)  # ~5000 atoms: probes stop at ~2000
    with pytest.raises(ConfigError, match=r"did not grow with the batch.*give max_atoms a number"):
        measured(data, reader, model)
    assert max(n for n, _ in model.seen) <= 4096


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.5])
def test_memory_fraction_must_be_a_share(fraction: float):
    with pytest.raises(ConfigError, match=r"memory_fraction must be in \(0, 1\]"):
        SizeAwareSampler(argon_crystals(2, 1), max_atoms="auto", memory_fraction=fraction)


def test_max_atoms_takes_a_number_or_auto():
    with pytest.raises(ConfigError, match="max_atoms must be a number >= 1 or 'auto'"):
        SizeAwareSampler(argon_crystals(2, 1), max_atoms="lots")  # type: ignore[arg-type]


def test_an_unmeasured_budget_is_refused():
    """Bound without a probe (a check that runs nothing) the budget is not known."""
    sampler = SizeAwareSampler(argon_crystals(2, 1), max_atoms="auto")
    sampler.bind(CUTOFF + SKIN)
    with pytest.raises(ConfigError, match="has not measured its budget"):
        sampler.budget()


def test_pipelines_refuse_auto_before_launching():
    sim = al.Simulator(
        LennardJones(0.0104, 3.40, CUTOFF), FIRE(fmax=0.05, max_steps=2),
        strategy="replicas", devices=2, accelerator="cpu",
    )  # fmt: skip
    with pytest.raises(ConfigError, match="replicas runs cannot: give max_atoms a number"):
        sim.run(SizeAwareSampler(argon_crystals(4, 1), max_atoms="auto"))


def test_a_model_failing_on_a_probe_is_reported():
    class Broken(Recording):
        def energy_and_edge_gradient(self, batch, edges):  # type: ignore[no-untyped-def]
            raise RuntimeError("no kernel for this")

    model = Broken()
    with pytest.raises(ConfigError, match=r"Broken failed on a probe batch.*no kernel for this"):
        measured(argon_crystals(4, 1), LawReader(model, 0, 1.0, 0, MiB), model)


class StatedMemory(ProcessMemoryReader):
    """This process's real peaks, on a machine said to have ``free`` bytes free."""

    def __init__(self, free: int) -> None:
        super().__init__()
        self.free = free

    def available(self) -> int:
        return self.free


@pytest.mark.timeout(60)
def test_auto_on_cpu_sizes_a_real_run_that_never_exceeds_its_budget(tmp_path):
    """Real probes (this process's resident memory) on a machine with 8 MiB free: the
    run's batches stay within the budget, a full batch measures below the free memory,
    and the fit and budget are recorded with the run in its store."""
    model = Recording(cutoff=8.5)  # ~12 KiB an atom: probes of a few MiB, above the noise
    data = mixed_argon(n_systems=60, min_atoms=20, max_atoms=60, seed=0)
    reader = StatedMemory(8 * MiB)
    sampler = SizeAwareSampler(data, max_atoms="auto", memory_reader=reader)
    store = tmp_path / "r.zarr"
    sim = al.Simulator(
        model, FIRE(fmax=0.05, max_steps=3), sinks=[ZarrSink(store, mode="w")],
        accelerator="cpu",
    )  # fmt: skip
    model.seen.clear()
    results = sim.run(sampler)
    assert len(results) == len(data)
    fit = sampler.memory_fit
    assert fit is not None and fit["reader"] == "process"
    budget = sampler.max_atoms
    edge_budget = sampler.max_edges if sampler.max_edges is not None else 1 << 62
    assert budget >= int(sampler.sizes.max())
    assert budget < int(sampler.sizes.sum()) or edge_budget < count_pairs_of(data, 9.5)
    assert max(n for n, _ in model.seen) <= budget  # probes and run alike
    assert max(e for _, e in model.seen) <= edge_budget
    run = zarr.open_group(str(store), mode="r").attrs["runs"][-1]
    assert run["memory_budget"]["max_atoms"] == budget
    assert run["memory_budget"]["probes"] == fit["probes"]
    # a full batch really fits: measured, it stays under the free memory
    pairs = sampler.edges if sampler.edges is not None else np.zeros(len(data), dtype=int)
    batch, n, e = [], 0, 0
    for k in np.argsort(sampler.sizes):
        if n + sampler.sizes[k] <= budget and e + pairs[k] <= edge_budget:
            batch.append(data[k])
            n, e = n + sampler.sizes[k], e + pairs[k]
    assert n > 0.9 * budget or e > 0.9 * edge_budget
    probe = cpu_probe(model)
    reader.start()
    probe(batch)
    assert reader.peak_growth() <= reader.free


def test_auto_from_a_config(tmp_path):
    """``data.sampler: {max_atoms: auto}`` builds the measuring sampler; anything but a
    number or ``auto`` is refused naming the key."""
    from alchemi_lit.cli import main

    base = (
        "simulator:\n  model: {class_path: lj-argon}\n  stages: [{class_path: FIRE}]\n"
        "  accelerator: cpu\ndata:\n  structures: builtin:argon\n"
        "  builtin_args: {n_systems: 2, repeat: 1}\n"
    )
    good = tmp_path / "good.yaml"
    good.write_text(base + "  sampler: {max_atoms: auto, memory_fraction: 0.5}\n")
    assert main(["validate", "--config", str(good)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(base + "  sampler: {max_atoms: lots}\n")
    assert main(["validate", "--config", str(bad)]) == 2


def test_a_restart_without_finished_systems_measures_again():
    """``without`` (a restart leaving out stored systems) keeps "auto" and its settings."""
    sampler = SizeAwareSampler(argon_crystals(4, 1), max_atoms="auto", memory_fraction=0.3)
    rest = sampler.without({0, 1})
    assert rest.requested_budget() == ("auto", None, None)
    assert rest.memory_fraction == 0.3 and len(rest) == 2


def test_the_fingerprint_sees_auto_not_what_was_measured():
    """A resume re-measures: the input digest holds "auto", so a different measured
    budget does not make the resume a different run."""
    from alchemi_lit.engine.fingerprint import input_digest

    data = argon_crystals(4, 1)
    sampler = SizeAwareSampler(data, max_atoms="auto")
    before = input_digest(sampler)
    sampler.max_atoms = 7  # what a measurement would set
    assert input_digest(sampler) == before
    assert input_digest(SizeAwareSampler(data, max_atoms=7)) != before


def test_one_structure_dataset():
    model = Recording()
    data = [bulk("Ar", "fcc", a=5.26, cubic=True).repeat(2)]
    sampler = measured(data, LawReader(model, 0.0, 4096.0, 0.0, 64 * MiB), model)
    assert sampler.max_atoms == 32


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_auto_on_a_gpu_reads_the_device():
    """On a GPU: PyTorch's allocator statistics drive the fit; with 256 MiB said to be
    free, a full batch measured on the device stays under it."""
    from alchemi_lit.data.memory import CudaMemoryReader

    class StatedDevice(CudaMemoryReader):
        def available(self) -> int:
            return 256 * MiB

    model = Recording(cutoff=8.5).to("cuda")
    data = mixed_argon(n_systems=400, min_atoms=20, max_atoms=150, seed=0)
    reader = StatedDevice("cuda")
    probe = MemoryProbe(model, torch.float64, torch.device("cuda"), stress=True)
    sampler = SizeAwareSampler(data, max_atoms="auto", memory_reader=reader)
    sampler.bind(8.5 + SKIN, probe)
    fit = sampler.memory_fit
    assert fit["reader"] == "cuda" and max(p[2] for p in fit["probes"]) > 0
    pairs = sampler.edges if sampler.edges is not None else np.zeros(len(data), dtype=int)
    edge_budget = sampler.max_edges if sampler.max_edges is not None else 1 << 62
    batch, n, e = [], 0, 0
    for k in np.argsort(sampler.sizes):
        if n + sampler.sizes[k] <= sampler.max_atoms and e + pairs[k] <= edge_budget:
            batch.append(data[k])
            n, e = n + sampler.sizes[k], e + pairs[k]
    reader.start()
    probe(batch)
    assert reader.peak_growth() <= 256 * MiB
    # and a real run on the device's own free memory picks a budget
    sim = al.Simulator(model, FIRE(fmax=0.05, max_steps=2), accelerator="cuda")
    auto = SizeAwareSampler(data[:40], max_atoms="auto")
    assert len(sim.run(auto)) == 40 and auto.memory_fit["reader"] == "cuda"


def test_probes_stay_within_a_quarter_of_the_usable_memory():
    """10 KiB per atom, 64 MiB free, memory_fraction 0.8: no probe may take more than
    0.25 x 0.8 x 64 MiB, although the signal to stop (32 resolutions) is not reached."""
    model = Recording()
    reader = LawReader(model, 0.0, 10240.0, 0.0, 64 * MiB)
    reader.resolution = MiB
    data = mixed_argon(n_systems=60, max_atoms=100, seed=6)
    measured(data, reader, model, memory_fraction=0.8)
    grown = [reader.peak_growth_of(n, e) for n, e in reader.readings]
    assert max(grown) <= 0.25 * 0.8 * 64 * MiB
    assert max(n for n, _ in reader.readings) < sum(len(x) for x in data)  # the cap bound
