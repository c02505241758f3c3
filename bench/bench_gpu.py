"""GPU benchmark of issue #26: alchemi_lit's step against its bare model call and TorchSim.

Run from the repository root (``scripts/gpu_check.sh`` runs it on a GPU machine)::

    python bench/bench_gpu.py --device cuda --json out.json   # minutes; --deadline S caps it
    python bench/bench_gpu.py --device cpu --quick            # smoke run, timings mean nothing

Rows (every size is smaller with ``--quick``):

* LJ Langevin of 108-atom argon crystals (ε 0.0104 eV, σ 3.40 Å, rc 8.5 Å, dt 2 fs,
  60 K, friction 0.01/fs) at 64 / 1,024 / 8,192 systems, float64 and float32;
* LJ FIRE (ASE's) of 1,024 of them, float64, with an fmax nobody meets (the batch
  stays whole while timed);
* SevenNet-0 (float32) Langevin (1 fs, 300 K) and FIRE of 384 real crystals (16
  strained, rattled copies of crystals.py's set), and a whole FIRE relaxation of
  them to fmax 0.05 eV/Å.

Each alongside TorchSim 0.6 on the same device, structures and dtype where it is
importable (its LennardJonesModel and sevenn's TorchSim wrapper, through
``ts.integrate`` / ``ts.optimize``, all systems in one batch); its rows are skipped
with the reason otherwise, and capped by ``--peer-budget`` seconds each (a slower
row shows one run's estimate, marked ``~``).

Per step: the median over ``--repeats`` of ``(T(long run) - T(short run)) / extra
steps`` after a warm-up run (gpu_measure.py says why), atom-steps/s, peak device memory
(``torch.cuda.max_memory_allocated``); for alchemi_lit also the bare model call on the
same batch -- the framework's share of a step is ``(step - bare) / step`` -- blocking
syncs per step (``torch.cuda.set_sync_debug_mode("warn")``, CUDA only) and the host
reads and aten ops per step counted by ``alchemi_lit.testing.StepProbe`` under
``accelerator_path()``, each in a separate, untimed run.  Then the issue's targets.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import median, setup_threads
from gpu_measure import (
    StepTiming,
    SyncCount,
    SyncTally,
    call_time,
    peak_memory,
    probe_summary,
    probe_tools,
    repeat_runs,
    step_time,
    sync_warnings,
    syncs_by_difference,
)
from gpu_report import environment, print_report
from gpu_workloads import (
    LJ_MD,
    MLIP_MD,
    NEVER,
    AlchemiCase,
    TorchSimCase,
    agreement,
    argon,
    fire_steps,
    langevin,
    lj_model,
    real_crystals,
    relax,
    sevennet_model,
    torchsim_lj,
    torchsim_sevennet,
    torchsim_status,
)

FULL = {
    "lj_sizes": (64, 1024, 8192),
    "fire_systems": 1024,
    "copies": 16,
    "target_s": 0.6,
    "count_steps": 12,
    "peer_budget": 15.0,
}
QUICK = {
    "lj_sizes": (4, 8, 16),
    "fire_systems": 8,
    "copies": 1,
    "target_s": 0.05,
    "count_steps": 6,
    "peer_budget": 10.0,
}
BIG = 200_000  # atoms: above, shorter warm runs and counted runs (a step takes long)
FMAX, RELAX_STEPS = 0.05, 500


class Bench:
    """Runs the rows, prints a line per measurement, keeps every figure for the JSON."""

    def __init__(self, args: argparse.Namespace, plan: dict[str, Any]) -> None:
        self.args, self.plan = args, plan
        self.device = torch.device(args.device)
        self.budget = args.peer_budget or plan["peer_budget"]
        self.deadline = time.perf_counter() + args.deadline if args.deadline else None
        self.rows: list[dict[str, Any]] = []
        self._argon: dict[int, list[Any]] = {}
        self.notes: list[str] = []
        self.peer_cost: dict[str, tuple[float, int]] = {}  # label -> (s per atom-step, systems)
        self.ts, why = (None, "TorchSim left out (--no-torchsim)")
        if not args.no_torchsim:
            self.ts, why = torchsim_status()
        self.notes.append(why if self.ts is not None else f"TorchSim rows skipped: {why}")
        self.probe = probe_tools()
        if self.probe is None:
            self.notes.append(
                "host reads / aten ops not counted: this alchemi_lit has no "
                "alchemi_lit.testing.StepProbe yet"
            )

    def time_left(self, label: str) -> bool:
        """False (and a note) once ``--deadline`` has passed: the rows after it are
        listed as not run rather than cut off by the caller's timeout."""
        if self.deadline is None or time.perf_counter() < self.deadline:
            return True
        self.notes.append(f"not run (--deadline {self.args.deadline:.0f} s passed): {label}")
        return False

    # ------------------------------------------------------------------ rows
    def alchemi(self, label: str, case: AlchemiCase, count: bool = True) -> dict[str, Any]:
        """Time per step and the bare model call; with ``count``, the syncs (CUDA) and
        the StepProbe's reads and ops in separate, untimed runs."""
        big = case.n_atoms > BIG
        short = 2 if big or "SevenNet" in label else 5
        with peak_memory(self.device) as mem:
            timing = step_time(
                case.run, self.device, short, self.args.repeats, self.plan["target_s"]
            )
        row = self.row(label, "alchemi_lit", case.n_systems, case.n_atoms, timing, mem["MiB"])
        t = call_time(case.bare, self.device, self.args.repeats)
        row.update(
            bare_ms=1e3 * t,
            framework=(timing.median - t) / timing.median,
            bare_atom_steps_s=case.n_atoms / t,
        )
        n = self.plan["count_steps"] // (2 if big else 1)
        if count and self.device.type == "cuda":
            tally = SyncCount()
            with sync_warnings(self.device) as caught:
                case.run(n, callbacks=[SyncTally(caught, tally)])
            row.update(tally.summary())
        if count and self.probe is not None:
            step_probe, accelerator_path = self.probe
            probe = step_probe()
            with accelerator_path(), probe:
                case.run(n, callbacks=[probe])
            row.update(probe_summary(probe))
            case.fresh_neighbour_list()
        return self.keep(row)

    def torchsim(self, label: str, run: Any, ref: dict[str, Any]) -> None:
        """TorchSim's row, within ``--peer-budget``; extrapolated from its last row of
        the same workload (per atom-step, marked ``~``) where one pass would not fit."""
        cost = self.peer_cost.get(label)
        if cost is not None and cost[0] * ref["atoms"] * 5 > self.budget:
            timing = StepTiming(
                [cost[0] * ref["atoms"]], 0, 0, f"~ extrapolated from {cost[1]} systems"
            )
            self.keep(self.row(label, "TorchSim", ref["systems"], ref["atoms"], timing, None), ref)
            return
        short = 2 if "SevenNet" in label else 1
        with peak_memory(self.device) as mem:
            timing = step_time(
                run,
                self.device,
                short,
                self.args.repeats,
                self.plan["target_s"],
                budget_s=self.budget,
            )
        row = self.row(label, "TorchSim", ref["systems"], ref["atoms"], timing, mem["MiB"])
        self.peer_cost[label] = (timing.median / ref["atoms"], ref["systems"])
        one_pass = timing.median * (timing.short + timing.long + 2)
        if self.device.type == "cuda" and timing.long > timing.short and one_pass < 3.0:
            row.update(syncs_by_difference(run, self.device, timing.short, timing.long))
        self.keep(row, ref)

    def row(
        self,
        label: str,
        engine: str,
        systems: int,
        atoms: int,
        timing: StepTiming,
        mib: float | None,
    ) -> dict[str, Any]:
        return {
            "workload": label,
            "engine": engine,
            "systems": systems,
            "atoms": atoms,
            "ms_per_step": 1e3 * timing.median,
            "ms_all": [1e3 * t for t in timing.per_step],
            "steps": [timing.short, timing.long],
            "capped": timing.capped,
            "atom_steps_s": atoms / timing.median,
            "peak_MiB": mib,
        }

    def keep(self, row: dict[str, Any], ref: dict[str, Any] | None = None) -> dict[str, Any]:
        if ref is not None:
            row["vs_alchemi"] = row["ms_per_step"] / ref["ms_per_step"]
        self.rows.append(row)
        mark = f" ({row['capped']})" if row.get("capped") else ""
        extra = f", framework {row['framework']:.0%}" if "framework" in row else ""
        print(
            f"  {row['workload']}, {row['systems']} systems: {row['engine']} "
            f"{row['ms_per_step']:.2f} ms/step{extra}{mark}",
            flush=True,
        )
        self.save()
        return row

    def side_by_side(
        self, label: str, case: AlchemiCase, make_peer: Any, energy: bool, count: bool = True
    ) -> bool:
        """alchemi_lit's row, then TorchSim's on the same atoms when it runs here (its
        model checked against ours before any step, on a workload's first row); True
        where TorchSim's row was made."""
        if not self.time_left(f"{label}, {case.n_systems} systems"):
            return False
        ours = self.alchemi(label, case, count)
        if self.ts is None or not self.time_left(f"{label}, {case.n_systems} systems, TorchSim"):
            return False
        try:
            peer, run = make_peer()
            if label not in self.peer_cost:
                err, text = agreement(case, peer, energy)
                limit = 1e-4 if energy else (1e-8 if case.precision == "64" else 2e-3)
                self.notes.append(f"{label}: TorchSim vs alchemi_lit before any step: {text}")
                if not err <= limit:
                    self.notes.append(f"{label}: TorchSim skipped, over the limit {limit:.0e}")
                    return False
            self.torchsim(label, run, ours)
            return True
        except Exception as exc:  # a peer's failure is reported, the benchmark goes on
            self.notes.append(f"{label}: TorchSim failed: {type(exc).__name__}: {exc}")
            print(f"  {label}: TorchSim failed: {type(exc).__name__}: {exc}", flush=True)
            return False

    # ------------------------------------------------------------------ plan
    def argon(self, n: int) -> list[Any]:
        """The argon set of ``n`` crystals, built once for both precisions and FIRE."""
        if n not in self._argon:
            self._argon[n] = argon(n)
        return self._argon[n]

    def lj_langevin(self, precision: str) -> None:
        """Counted (syncs, reads, ops) in float64 only: float32 takes the same path."""
        dev, ts = self.device, self.ts
        dtype = torch.float64 if precision == "64" else torch.float32
        for n in self.plan["lj_sizes"]:
            atoms = self.argon(n)
            case = AlchemiCase(lj_model(), atoms, langevin(LJ_MD), dev, precision)

            def peer(atoms: list[Any] = atoms) -> Any:
                side = TorchSimCase(ts, torchsim_lj(ts, dev, dtype), atoms, dev)
                return side, side.langevin(LJ_MD)

            self.side_by_side(
                f"LJ Langevin f{precision}", case, peer, energy=False, count=precision == "64"
            )

    def lj_fire(self) -> None:
        dev, ts = self.device, self.ts
        atoms = self.argon(self.plan["fire_systems"])
        case = AlchemiCase(lj_model(), atoms, fire_steps, dev, "64")

        def peer() -> Any:
            side = TorchSimCase(ts, torchsim_lj(ts, dev, torch.float64), atoms, dev)
            return side, side.fire(NEVER)

        self.side_by_side("LJ FIRE f64", case, peer, energy=False)

    def sevennet(self) -> None:
        """Langevin side by side; FIRE per step for alchemi_lit (its framework share),
        and whole relaxations side by side."""
        if not self.time_left("SevenNet-0 rows"):
            return
        try:
            model = sevennet_model()
        except ImportError as exc:
            self.notes.append(f"SevenNet-0 rows skipped: {exc}")
            return
        dev, ts = self.device, self.ts
        atoms = real_crystals(self.plan["copies"], self.args.quick)
        side: list[TorchSimCase] = []

        def peer() -> Any:
            side.append(TorchSimCase(ts, torchsim_sevennet(ts, dev), atoms, dev))
            return side[0], side[0].langevin(MLIP_MD)

        case = AlchemiCase(model, atoms, langevin(MLIP_MD), dev, "32")
        if not self.side_by_side("SevenNet-0 Langevin", case, peer, energy=True):
            side.clear()  # no TorchSim relaxation where its Langevin row was not made
        if self.time_left("SevenNet-0 FIRE"):
            fire = AlchemiCase(model, atoms, fire_steps, dev, "32")
            self.alchemi("SevenNet-0 FIRE", fire, count=False)  # Langevin's counts cover it
        if self.time_left("SevenNet-0 relaxations"):
            self.relaxation(model, atoms, side[0] if side else None)

    def relaxation(self, model: Any, atoms: list[Any], peer: TorchSimCase | None) -> None:
        """Whole relaxations to FMAX: alchemi_lit ``--repeats`` times, TorchSim as often
        as ``--peer-budget`` allows (at least once)."""
        label = f"SevenNet-0 FIRE relax to {FMAX}"
        engines: list[tuple[str, Any, float | None]] = [
            ("alchemi_lit", relax(model, atoms, self.device, FMAX, RELAX_STEPS), None)
        ]
        if peer is not None:
            engines.append(("TorchSim", peer.relax(FMAX, RELAX_STEPS), self.budget))
        ref: dict[str, Any] | None = None
        for engine, fn, budget in engines:
            walls, out, mib = repeat_runs(fn, self.device, self.args.repeats, budget)
            row = {"workload": label, "engine": engine, "systems": len(atoms),
                   "atoms": sum(len(a) for a in atoms), "wall_s": median(walls),
                   "walls": walls, "peak_MiB": mib, **out}  # fmt: skip
            ref = ref or row
            row["vs_alchemi"] = row["wall_s"] / ref["wall_s"]
            self.rows.append(row)
            print(f"  {label}: {engine} {row['wall_s']:.2f} s ({len(walls)} runs)", flush=True)
            self.save()

    def save(self) -> None:
        """The JSON after every row: a run stopped by a timeout keeps what it measured."""
        if self.args.json:
            out = {
                "environment": environment(self.device),
                "args": vars(self.args),
                "rows": self.rows,
                "notes": self.notes,
            }
            Path(self.args.json).write_text(json.dumps(out, indent=1, default=str))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu only as a smoke run (with --quick)",
    )
    p.add_argument("--quick", action="store_true", help="every row, small: a smoke run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", nargs="*", choices=("lj", "sevennet"), default=["lj", "sevennet"])
    p.add_argument("--no-torchsim", action="store_true", help="alchemi_lit's rows only")
    p.add_argument(
        "--peer-budget",
        type=float,
        default=None,
        help="seconds for each TorchSim row (default 20, 10 with --quick)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="seconds after which no new row starts (the rest are listed)",
    )
    p.add_argument("--threads", type=int, default=4, help="torch's CPU threads")
    p.add_argument("--json", default=None, help="write every figure here (after each row)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "--device cuda, but torch sees no CUDA device (--device cpu --quick for a smoke run)"
        )
    setup_threads(args.threads)
    bench = Bench(args, QUICK if args.quick else FULL)
    print(f"# GPU benchmark (issue #26) on {args.device} | {environment(bench.device)}")
    if args.quick:
        print("# SMOKE RUN (--quick): every row, small; its timings mean nothing")
    t0 = time.perf_counter()
    # the headline rows first: a --deadline leaves out the last ones
    if "lj" in args.only:
        bench.lj_langevin("64")
        bench.lj_fire()
    if "sevennet" in args.only:
        bench.sevennet()
    if "lj" in args.only:
        bench.lj_langevin("32")
    bench.notes.append(f"benchmark wall time {time.perf_counter() - t0:.0f} s")
    bench.save()
    print_report(bench.rows, bench.notes, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
