"""``Simulator(cuda_graphs=True)`` against eager steps on one GPU (issue #26 part 3).

    python bench/bench_cuda_graphs.py --device cuda [--json out.json] [--quick]

LJ Langevin (f64) of 108-atom argon crystals at 64 / 1,024 / 8,192 systems and LJ FIRE
(f64, an fmax nobody meets) of 1,024: time per steady step, eager and with graphs, in
interleaved repeats (median of 3; ``(T(long) - T(short)) / extra steps``, as
bench_gpu.py), the bare model call on the same batch and the framework's share of each
step; how many steps replayed; and the largest position difference between a graphed
and an eager run of the same 100 steps; and the device's timeline of each
(:mod:`gpu_timeline`: device time inside a step, and idle between two -- what tells a
slower replay from a device waiting for the host).  Then whole inflight runs of 4,096
systems, 1,024 in flight (an LJ FIRE relaxation to 0.05 eV/Å, and FIRE fused with 200
Langevin steps), eager against graphs: wall time, replayed steps, captures (one after
each refill), and the results' agreement: the largest position difference, how many
systems differ and how many took other step counts, beside two eager runs' difference
(the device's own nondeterminism).  ``--deterministic`` runs everything with
``torch.use_deterministic_algorithms`` (warn only; the nondeterministic operations met
are listed): if graphs and eager then agree, atomic adds explain a difference without it.
``--quick`` (CPU smoke run): 4 and 16 systems, graphs emulated
(:func:`alchemi_lit.testing.emulated_cuda_graphs`), timings meaningless.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from pathlib import Path

import torch
from common import median, setup_threads
from gpu_measure import call_time, step_time, timed
from gpu_timeline import step_marks, timeline
from gpu_workloads import LJ_MD, NEVER, argon, lj_model

import alchemi_lit as al
from alchemi_lit.data import SizeAwareSampler
from alchemi_lit.integrators import FIRE, Langevin


def simulator(model, stage, device, graphs):
    return al.Simulator(model=model, stages=stage, accelerator=device.type, precision="64",
                        seed=0, cuda_graphs=graphs)  # fmt: skip


def row(name, n, stage_of, device, repeats, short, target_s):
    model = lj_model().to(device)
    batch = simulator(model, stage_of(1), device, False).prepare(argon(n))
    runs = {g: (lambda k, g=g: simulator(model, stage_of(k), device, g).run(batch))
            for g in (False, True)}  # fmt: skip
    times = {False: [], True: []}
    for _ in range(repeats):  # interleaved: eager, graphs, eager, graphs ...
        for g in (False, True):
            times[g] += step_time(runs[g], device, short, 1, target_s, max_steps=400).per_step
    bare = call_time(lambda: model(batch, compute_stress=False), device, repeats)
    eager = simulator(model, stage_of(100), device, False).run(batch)
    sim = simulator(model, stage_of(100), device, True)
    graphed = sim.run(batch)
    steps = sim.strategy.run_loop.step  # (GraphedSteps: its counters)
    diff = float((eager.batch.positions - graphed.batch.positions).abs().max())
    lines = {}
    for g in (False, True):  # the device's timeline: busy in a step, idle between steps
        with step_marks(device) as marks:
            runs[g](60)
        lines[g] = timeline(marks, device)
    out = {"workload": name, "systems": n, "atoms": int(batch.num_atoms), "bare_ms": bare * 1e3,
           "replays": steps.replays, "captures": steps.captures,
           "disabled": steps.disabled, "max_dpos_A": diff}  # fmt: skip
    for g, key in ((False, "eager"), (True, "graphs")):
        step = median(times[g])
        out[f"{key}_ms"] = step * 1e3
        out[f"{key}_range_ms"] = [min(times[g]) * 1e3, max(times[g]) * 1e3]
        out[f"{key}_framework"] = (step - bare) / step
        out[f"{key}_atom_steps_per_s"] = batch.num_atoms / step
        out[f"{key}_span_ms"] = lines[g]["span_ms"]
        out[f"{key}_gap_ms"] = lines[g]["gap_ms"]
    return out


def relax_plan():
    return FIRE(fmax=0.05, max_steps=500)


def relax_md_plan():
    return relax_plan() + Langevin(steps=200, **LJ_MD)


def whole_run(name, plan, n, in_flight, device, repeats):
    """A whole inflight run of ``n`` systems, ``in_flight`` at a time (the batch
    refilled as systems finish, so the graph is captured again after each refill):
    wall time with set-up, eager against graphs interleaved, how many steps replayed,
    and how far the graphed results are from the eager ones."""
    model = lj_model().to(device)
    atoms = argon(n)
    made, lists = {}, {}

    def run(g):
        nl = model.neighbors
        before = (nl.num_builds, nl.skin_watch.violations)
        sim = simulator(model, plan(), device, g)
        made[g] = sim, sim.run(SizeAwareSampler(atoms, max_atoms=108 * in_flight))
        lists[g] = (nl.num_builds - before[0], nl.skin_watch.violations - before[1])

    times = {False: [], True: []}
    for g in (False, True):  # warm-up
        run(g)
    first_eager = made[False][1]
    for _ in range(repeats):
        for g in (False, True):
            times[g].append(timed(lambda g=g: run(g), device)[0])
    sim, graphed = made[True]
    eager = made[False][1]
    steps = sim.strategy.run_loop.step
    dpos = (eager.batch.positions - graphed.batch.positions).abs().amax(1)  # per atom
    diff = float(dpos.max())
    differ = int(eager.batch.segments.sum(dpos.gt(1e-9).to(torch.float64)).gt(0).sum())
    other_steps = int((eager.stage_steps != graphed.stage_steps).any(1).sum())  # any stage
    # two eager runs of the same work: what the device's nondeterminism (atomic adds)
    # and a cadence that follows timing leave between runs with no graph involved
    noise = float((eager.batch.positions - first_eager.batch.positions).abs().max())
    out = {"workload": name, "systems": n, "in_flight": in_flight, "eager_vs_eager_A": noise,
           "steps": sim.strategy.run_loop.stats.steps, "replays": steps.replays,
           "captures": steps.captures, "disabled": steps.disabled, "max_dpos_A": diff,
           "same_steps": bool((eager.steps == graphed.steps).all()),
           "systems_differ": differ, "systems_other_steps": other_steps,
           "list_builds_eager_graphs": [lists[False][0], lists[True][0]],
           "skin_violations_eager_graphs": [lists[False][1], lists[True][1]]}  # fmt: skip
    for g, key in ((False, "eager"), (True, "graphs")):
        out[f"{key}_s"] = median(times[g])
        out[f"{key}_range_s"] = [min(times[g]), max(times[g])]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", type=Path)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", nargs="*", choices=("steps", "whole"), default=["steps", "whole"],
                   help="steady steps per row, whole inflight runs, or both")  # fmt: skip
    p.add_argument("--deterministic", action="store_true",
                   help="torch.use_deterministic_algorithms(True, warn_only=True) throughout")
    args = p.parse_args(argv)
    if args.deterministic:  # (cuBLAS reads its workspace setting when first used)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    setup_threads()
    device = torch.device(args.device)
    sizes, fire_n = ((4, 16), 16) if args.quick else ((64, 1024, 8192), 1024)
    whole_n = 16 if args.quick else 4096
    switch = contextlib.ExitStack()
    if device.type != "cuda":
        from alchemi_lit.testing import accelerator_path, emulated_cuda_graphs

        switch.enter_context(accelerator_path())
        switch.enter_context(emulated_cuda_graphs())
    target = 0.2 if args.quick else 2.0
    rows, wholes = [], []
    met = switch.enter_context(warnings.catch_warnings(record=True))
    warnings.simplefilter("always")
    with switch:
        for n in sizes if "steps" in args.only else ():
            rows.append(row("LJ Langevin f64", n, lambda k: Langevin(steps=k, **LJ_MD),
                            device, args.repeats, 10, target))  # fmt: skip
            print(rows[-1], flush=True)
        if "steps" in args.only:
            rows.append(row("LJ FIRE f64", fire_n, lambda k: FIRE(fmax=NEVER, max_steps=k),
                            device, args.repeats, 10, target))  # fmt: skip
            print(rows[-1], flush=True)
        plans = (("LJ FIRE relaxation f64", relax_plan),
                 ("LJ FIRE + Langevin 200 steps, fused, f64", relax_md_plan))  # fmt: skip
        for label, plan in plans if "whole" in args.only else ():
            wholes.append(whole_run(label, plan, whole_n, whole_n // 4, device, args.repeats))
            print(wholes[-1], flush=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    nondeterministic = sorted({str(w.message).split(" does not have")[0] for w in met
                               if "deterministic" in str(w.message)})  # fmt: skip
    print(f"\n# CUDA graphs vs eager steps on {name}, torch {torch.__version__}"
          f"{', deterministic algorithms' if args.deterministic else ''}")
    if args.deterministic:
        print(f"# nondeterministic operations met: {nondeterministic or 'none'}")
    head = ("workload", "systems", "eager ms", "graphs ms", "speed-up", "bare ms",
            "framework eager", "framework graphs", "atom-steps/s graphs", "replays",
            "max |dx| A", "device span ms eager / graphs", "idle between steps ms")  # fmt: skip
    print(" | ".join(head))
    for r in rows:
        print(" | ".join([
            r["workload"], str(r["systems"]), f"{r['eager_ms']:.2f}", f"{r['graphs_ms']:.2f}",
            f"{r['eager_ms'] / r['graphs_ms']:.2f}x", f"{r['bare_ms']:.2f}",
            f"{r['eager_framework']:.0%}", f"{r['graphs_framework']:.0%}",
            f"{r['graphs_atom_steps_per_s'] / 1e6:.2f} M",
            f"{r['replays']}/{r['captures']} captures", f"{r['max_dpos_A']:.1e}",
            f"{r['eager_span_ms']:.2f} / {r['graphs_span_ms']:.2f}",
            f"{r['eager_gap_ms']:.3f} / {r['graphs_gap_ms']:.3f}",
        ]))  # fmt: skip
        if r["disabled"]:
            print(f"   (graphs off: {r['disabled']})")
    print("\nwhole runs (inflight, refilled as systems finish) | systems | in flight | eager s | "
          "graphs s | speed-up | steps | replays | captures | same steps | max |dx| A | "
          "systems differing / other steps | eager vs eager max |dx| A | list builds eager / "
          "graphs | skin violations eager / graphs")  # fmt: skip
    for w in wholes:
        print(" | ".join([
            w["workload"], str(w["systems"]), str(w["in_flight"]), f"{w['eager_s']:.2f}",
            f"{w['graphs_s']:.2f}", f"{w['eager_s'] / w['graphs_s']:.2f}x", str(w["steps"]),
            str(w["replays"]), str(w["captures"]), str(w["same_steps"]),
            f"{w['max_dpos_A']:.1e}", f"{w['systems_differ']} / {w['systems_other_steps']}",
            f"{w['eager_vs_eager_A']:.1e}",
            "{} / {}".format(*w["list_builds_eager_graphs"]),
            "{} / {}".format(*w["skin_violations_eager_graphs"]),
        ]))  # fmt: skip
        if w["disabled"]:
            print(f"   (graphs off: {w['disabled']})")
    if args.json:
        args.json.write_text(json.dumps({"device": name, "rows": rows, "whole_runs": wholes,
                                         "deterministic": args.deterministic,
                                         "nondeterministic_ops": nondeterministic},
                                        indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
