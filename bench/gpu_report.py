"""The tables and target lines bench_gpu.py prints from its rows."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import torch
from common import environment_line, format_table


def _f(value: Any, fmt: str, missing: str = "-") -> str:
    return missing if value is None else format(value, fmt)


def environment(device: torch.device) -> str:
    """common.environment_line, and the GPU's name and CUDA version on one."""
    line = environment_line()
    if device.type == "cuda":
        line += f" | {torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}"
    return line


def rate(x: float) -> str:
    """Atom-steps per second, readable from SevenNet's thousands to LJ's millions."""
    if x >= 1e6:
        return f"{x / 1e6:.2f} M"
    return f"{x / 1e3:.1f} k" if x >= 1e3 else f"{x:.0f}"


def step_table(rows: list[dict[str, Any]]) -> str:
    headers = (
        "workload",
        "systems",
        "atoms",
        "engine",
        "ms/step",
        "range ms",
        "atom-steps/s",
        "peak MiB",
        "syncs/step",
        "this / alchemi_lit",
    )
    out = []
    for r in rows:
        spread = r["ms_all"]
        mark = "~" if r["capped"].startswith("~") else ""
        out.append(
            (
                r["workload"],
                r["systems"],
                f"{r['atoms']:,}",
                r["engine"],
                f"{mark}{r['ms_per_step']:.2f}",
                f"{min(spread):.2f}-{max(spread):.2f}" if len(spread) > 1 else "-",
                f"{mark}{rate(r['atom_steps_s'])}",
                _f(r["peak_MiB"], ".0f"),
                _f(r.get("syncs_per_step"), ".1f"),
                f"{mark}{r['vs_alchemi']:.2f}x" if "vs_alchemi" in r else "",
            )
        )
    return format_table(headers, out)


def framework_table(rows: list[dict[str, Any]]) -> str:
    headers = (
        "workload",
        "systems",
        "step ms",
        "bare model ms",
        "framework",
        "bare atom-steps/s",
        "no-sync steps",
        "host reads/step",
        "no-read steps",
        "aten ops/step (max)",
    )
    out = []
    for r in rows:
        ops = r.get("ops_per_step")
        out.append(
            (
                r["workload"],
                r["systems"],
                f"{r['ms_per_step']:.2f}",
                f"{r['bare_ms']:.2f}",
                f"{r['framework']:.0%}",
                rate(r["bare_atom_steps_s"]),
                _f(r.get("steps_without_sync"), ".0%"),
                _f(r.get("reads_per_step"), ".1f"),
                _f(r.get("steps_without_read"), ".0%"),
                "-" if ops is None else f"{ops:.0f} ({r['ops_max']})",
            )
        )
    return format_table(headers, out)


def relax_table(rows: list[dict[str, Any]]) -> str:
    headers = (
        "engine",
        "systems",
        "atoms",
        "wall s",
        "runs",
        "steps mean/max",
        "converged",
        "this / alchemi_lit",
    )
    out = []
    for r in rows:
        steps = (
            f"{r['steps_mean']:.1f}/{r['steps_max']}"
            if "steps_mean" in r
            else f"{r.get('loop_steps')} (its batch loop)"
        )
        out.append(
            (
                r["engine"],
                r["systems"],
                f"{r['atoms']:,}",
                f"{r['wall_s']:.2f}",
                len(r["walls"]),
                steps,
                r.get("converged", "-"),
                f"{r['vs_alchemi']:.2f}x",
            )
        )
    return format_table(headers, out)


def targets(rows: list[dict[str, Any]], device: str) -> list[str]:
    """Issue #26's targets, each with the figure that decides it (benchmark figures,
    not timed tests: they mean something on a GPU only)."""
    ours = {
        (r["workload"], r["systems"]): r
        for r in rows
        if r["engine"] == "alchemi_lit" and "ms_per_step" in r
    }
    lj = sorted(
        (r for (w, _), r in ours.items() if w == "LJ Langevin f64"), key=lambda r: r["systems"]
    )
    lines = []

    def check(ok: bool, text: str) -> None:
        lines.append(f"[{'met' if ok else 'MISSED'}] {text}")

    if lj:
        small, large = lj[0], lj[-1]
        check(
            small["framework"] <= 0.15,
            f"LJ {small['systems']} x 108 f64: framework "
            f"{small['framework']:.0%} of the step (target <= 15 %)",
        )
        check(
            large["framework"] <= 0.10,
            f"LJ {large['systems']} x 108 f64: framework "
            f"{large['framework']:.0%} of the step (target <= 10 %)",
        )
        rates = [r["atom_steps_s"] for r in lj]
        text = " -> ".join(rate(x) for x in rates)
        check(
            all(b >= a for a, b in pairwise(rates)),
            f"LJ atom-steps/s never fall as systems are added: {text}",
        )
        if all("ops_per_step" in r for r in (small, large)):
            check(
                large["ops_per_step"] <= small["ops_per_step"],
                f"aten ops per step do not grow with systems: {small['ops_per_step']:.0f} "
                f"at {small['systems']}, {large['ops_per_step']:.0f} at {large['systems']}",
            )
    mlip = next((r for (w, _), r in ours.items() if w == "SevenNet-0 Langevin"), None)
    if mlip is not None:
        check(
            mlip["framework"] <= 0.03,
            f"SevenNet-0 Langevin, {mlip['systems']} crystals: "
            f"framework {mlip['framework']:.1%} of the step (target <= 3 %)",
        )
    for key, what in (
        ("steps_without_sync", "blocking syncs (CUDA)"),
        ("steps_without_read", "host reads (StepProbe)"),
    ):
        counted = [r for r in ours.values() if r.get(key) is not None]
        if counted:
            worst = min(counted, key=lambda r: r[key])
            check(
                worst[key] >= 0.9,
                f"0 {what} in >= 90 % of steady steps: worst "
                f"{worst[key]:.0%} ({worst['workload']}, {worst['systems']} systems)",
            )
    if device != "cuda":
        lines.append("(not a GPU: these lines check the script, not the targets)")
    return lines


def print_report(rows: list[dict[str, Any]], notes: list[str], device: str) -> None:
    steps = [r for r in rows if "ms_per_step" in r]
    ours = [r for r in steps if r["engine"] == "alchemi_lit"]
    relax = [r for r in rows if "wall_s" in r]
    print("\nTime per steady step (median of repeats; ~: an estimate, see notes):")
    print(step_table(steps))
    if ours:
        print(
            "\nalchemi_lit's framework share: (step - bare model call) / step, and what a "
            "steady step reads and launches:"
        )
        print(framework_table(ours))
    if relax:
        print(f"\n{relax[0]['workload']} (whole relaxations, every system in flight):")
        print(relax_table(relax))
    sites = [r for r in ours if r.get("sync_sites") or r.get("read_sites")]
    if sites:
        print("\nWhere the syncs and reads come from (most frequent first):")
        for r in sites:
            for where, n in r.get("sync_sites") or []:
                print(f"  {r['workload']}, {r['systems']}: sync x{n} at {where}")
            for where in r.get("read_sites") or []:
                print(f"  {r['workload']}, {r['systems']}: read {where}")
    print("\nTargets (issue #26):")
    for line in targets(rows, device):
        print(f"  {line}")
    for note in notes:
        print(f"* {note}")
