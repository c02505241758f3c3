"""Langevin NVT with a random MACE-MP-0-small: alchemi_lit vs TorchSim 0.6's MaceModel (#18).

Run (from the repository root; TorchSim needs its venv: ``bash bench/setup_torchsim.sh``)::

    python bench/bench_mace_nvt.py              # 24 crystals, 50 steps, 3 repeats
    python bench/bench_mace_nvt.py --quick      # smoke run: 4 crystals, 5 steps, 1 repeat

Workload: the crystal set of ``crystals.py`` (24 strained, rattled crystals, 234 atoms),
all in one batch in both engines, ``--steps`` Langevin steps (dt 1 fs, 300 K, friction
0.01/fs; both draw Maxwell-Boltzmann velocities), float32.  The model is the MACE
plugin's randomly initialised ``ScaleShiftMACE`` with the MACE-MP-0 small architecture
(no weights can be downloaded here; its cost is the real model's): alchemi_lit runs it
through ``alchemi_lit_mace.MACE``; its state dict is saved and loaded into the same
architecture in TorchSim's venv, run there through ``torch_sim.models.mace.MaceModel``
(mace's own TorchSim wrapper, stress off as in alchemi_lit's NVT).  Before timing the
two engines' energies and forces on the initial set are compared (the same weights:
they must agree to float32 round-off).

Both engines do the same work -- every atom through the network at every step --, so
parity is expected: the table gives wall time per step, atoms and edges through the
network (counted on ``ScaleShiftMACE.forward`` in both), the time outside the engine's
model call, and the ratio; medians of ``--repeats`` interleaved runs after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import environment_line, format_table, gate_arguments, gate_from, median, setup_threads
from crystals import crystal_set, quick_set
from mlip_counting import CallTimer, counted_run, mace_probe

TOLERANCE = {"energy": 2e-5, "forces": 5e-4}  # eV/atom, eV/Å: float32 MACE, two wrappers


class AlchemiMace:
    name = "alchemi_lit"

    def __init__(self, atoms: list[Any], seed: int) -> None:
        from alchemi_lit_mace import MACE

        self.atoms = atoms
        self.model = MACE(random_init="small", dtype="float32", seed=seed)
        self.probe = mace_probe()
        self.timer = CallTimer(type(self.model), "forward")

    def evaluate(self) -> dict[str, Any]:
        import torch

        import alchemi_lit as al

        batch = al.Batch.from_atoms(self.atoms, dtype=torch.float32)
        out = self.model(batch, compute_stress=False)
        return {k: v.double().tolist() for k, v in out.items()}

    def nvt(self, steps: int, dt_fs: float, temperature: float, friction: float) -> dict[str, Any]:
        import alchemi_lit as al
        from alchemi_lit.data import SizeAwareSampler
        from alchemi_lit.integrators import Langevin

        stage = Langevin(dt=dt_fs, temperature=temperature, friction=friction, steps=steps)
        sim = al.Simulator(
            model=self.model, stages=stage, precision="32", accelerator="cpu", seed=0
        )
        total = sum(len(a) for a in self.atoms)
        self.probe.reset()
        self.timer.reset()
        with self.probe, self.timer:
            t0 = time.perf_counter()
            res = sim.run(SizeAwareSampler(self.atoms, max_atoms=total))
            wall = time.perf_counter() - t0
        b = res.batch
        return {
            **counted_run(wall, self.probe, self.timer),
            "finite": bool(np.isfinite(b.positions.numpy()).all()),
            "steps": res.steps.tolist(),
        }


class TorchSimMace:
    def __init__(self, atoms: list[Any], alchemi: AlchemiMace, threads: int, tmp: Path) -> None:
        import torch
        from alchemi_lit_mace.model import MP_ARCHITECTURE, MP_ELEMENTS, MP_HIDDEN_IRREPS
        from torchsim_peer import TorchSimPeer

        state_path = tmp / "mace_state.pt"
        torch.save(alchemi.model.net.state_dict(), state_path)
        arch = {**MP_ARCHITECTURE, "hidden_irreps": MP_HIDDEN_IRREPS["small"]}
        arch["elements"] = list(MP_ELEMENTS)
        self.peer = TorchSimPeer(atoms, threads)
        self.info = self.peer.call(
            "setup", model="mace", threads=threads, dtype="float32",
            mace_arch=arch, mace_state=str(state_path),
        )  # fmt: skip
        self.name = f"TorchSim {self.info['versions']['torch-sim-atomistic']}"

    def evaluate(self) -> dict[str, Any]:
        return self.peer.call("evaluate")

    def nvt(self, steps: int, dt_fs: float, temperature: float, friction: float) -> dict[str, Any]:
        return self.peer.call(
            "nvt", steps=steps, dt_fs=dt_fs, temperature=temperature, friction=friction
        )

    def close(self) -> None:
        self.peer.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 4 crystals, 5 steps")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dt", type=float, default=1.0, help="fs")
    p.add_argument("--temperature", type=float, default=300.0, help="K")
    p.add_argument("--friction", type=float, default=0.01, help="1/fs")
    p.add_argument("--seed", type=int, default=0, help="seed of the random MACE weights")
    p.add_argument("--json", default=None, help="also write every run's numbers here")
    gate_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.repeats, args.no_wait = 5, 1, True

    setup_threads(args.threads)
    gate = gate_from(args)
    atoms = quick_set() if args.quick else crystal_set()
    sizes = np.array([len(a) for a in atoms], dtype=float)
    md = {"dt_fs": args.dt, "temperature": args.temperature, "friction": args.friction}
    print(
        f"# random MACE-MP-0-small Langevin NVT: {args.steps} steps, dt {args.dt} fs, "
        f"{args.temperature:g} K, friction {args.friction}/fs, float32"
    )
    print(f"# {len(atoms)} crystals, {int(sizes.sum())} atoms, one batch | {environment_line()}")
    if args.quick:
        print("# SMOKE RUN (--quick): checks that both engines run; its timings mean nothing")

    notes: list[str] = []
    engines: list[Any] = [AlchemiMace(atoms, args.seed)]
    with tempfile.TemporaryDirectory(prefix="alchemi_bench_mace_") as tmp:
        try:
            engines.append(TorchSimMace(atoms, engines[0], args.threads, Path(tmp)))
        except Exception as exc:  # a missing peer is reported, not fatal
            notes.append(f"TorchSim: skipped -- {type(exc).__name__}: {str(exc).splitlines()[0]}")
        try:
            if len(engines) > 1:
                notes.append(check_same_weights(engines, sizes))
            for eng in engines:  # warm-up
                eng.nvt(steps=2, **md)
            runs: dict[str, list[dict[str, Any]]] = {e.name: [] for e in engines}
            for r in range(args.repeats):
                k = r % len(engines)
                for eng in engines[k:] + engines[:k]:
                    gate.wait(eng.name)
                    runs[eng.name].append(eng.nvt(steps=args.steps, **md))
                    wall = runs[eng.name][-1]["wall"]
                    print(f"  repeat {r + 1}: {eng.name} {wall:.2f} s", flush=True)
        finally:
            for eng in engines:
                getattr(eng, "close", lambda: None)()

    ref = median([r["wall"] for r in runs["alchemi_lit"]])
    rows = []
    for name, rs in runs.items():
        wall = median([r["wall"] for r in rs])
        last = rs[-1]
        outside = median([(r["wall"] - r["model_s"]) / r["wall"] for r in rs])
        rows.append(
            (
                name,
                f"{wall:.2f}",
                f"{1e3 * wall / args.steps:.1f}",
                last["forward_calls"],
                f"{last['atoms_through']:,}",
                f"{last['edges_through']:,}",
                f"{outside:.1%}",
                "yes" if all(r["finite"] for r in rs) else "NO",
                f"{wall / ref:.2f}x",
            )
        )
    print()
    headers = [
        "engine", "wall s", "ms/step", "forward calls", "atoms through", "edges through",
        "outside model", "finite", "this / alchemi_lit time",
    ]  # fmt: skip
    print(format_table(headers, rows))
    print()
    counts = {n: rs[-1]["atoms_through"] for n, rs in runs.items()}
    if len(set(counts.values())) > 1:
        least = min(counts.values())
        detail = ", ".join(f"{n} {c:,} (x{c / least:.3f})" for n, c in counts.items())
        notes.append(
            f"UNEQUAL WORK: atoms through the network: {detail}; {args.steps} steps need "
            f"{int(sizes.sum()) * (args.steps + 1):,} (each atom at the start and after each step)"
        )
    for note in notes:
        print(f"* {note}")
    print(f"* {gate.status_line()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs}, f)
    return 0


def check_same_weights(engines: list[Any], sizes: np.ndarray) -> str:
    a, b = engines[0].evaluate(), engines[1].evaluate()
    de = (np.abs(np.array(a["energy"]) - np.array(b["energy"])) / sizes).max()
    df = np.abs(np.array(a["forces"]) - np.array(b["forces"])).max()
    line = (
        f"initial set, {engines[1].name} vs alchemi_lit (same random weights): max |dE| "
        f"{de:.1e} eV/atom, |dF| {df:.1e} eV/Å, |F| up to {np.abs(a['forces']).max():.1e} eV/Å"
    )
    if not (de <= TOLERANCE["energy"] and df <= TOLERANCE["forces"]):
        raise SystemExit(f"the two engines' MACE models disagree: {line}")
    return line


if __name__ == "__main__":
    sys.exit(main())
