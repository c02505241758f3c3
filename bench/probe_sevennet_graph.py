"""Would SevenNet-0 gain from a CUDA graph?  A probe for a design decision (issue #26).

    cd bench && python probe_sevennet_graph.py --device cuda [--copies 16] [--json out.json]

Why: a captured step needs static shapes, but the SevenNet plugin drops the neighbour
list's skin pairs with ``nonzero`` (a count read on the host) because SevenNet's XPLOR
cutoff is not zero past the cutoff.  A capturable forward keeps every pair of the
list and sends the skin pairs in as a null edge of length exactly the cutoff, where
the envelope and its slope vanish, so their messages are zero: (6/5)^3 = 1.73x the
edges with the 5 Å cutoff and 1 Å skin.  This times, on the same batch of 384 real
crystals (3,744 atoms), the model's energy and edge gradient -- the forward and
backward a step makes, the neighbour list held fixed -- three ways: (a) as the plugin
does it (eager, skin pairs dropped), (b) eager with the skin pairs kept as null edges,
(c) (b) captured once as a CUDA graph and replayed; and checks (b) against (a).  A
graph pays only if (c) beats (a).  ``--device cpu`` runs (a) and (b) only (a smoke run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from common import median, setup_threads
from gpu_workloads import AlchemiCase, real_crystals, sevennet_model

from alchemi_lit.integrators import Langevin
from alchemi_lit.models.neighbors import Edges


def null_edge_energy(model, null):
    """The plugin's ``energy`` with the skin pairs kept, as edges of length cutoff."""

    def energy(batch, edges):
        vec = edges.vec
        inside = (vec.square().sum(-1) <= model.cutoff**2).unsqueeze(1)
        return model.pairs_energy(batch, edges.i, edges.j, torch.where(inside, vec, null))

    return energy


def timed_calls(fn, device, repeats):
    """Median seconds of ``fn()`` over ``repeats`` calls after two untimed ones."""
    fn()
    fn()
    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        out.append(time.perf_counter() - t0)
    return median(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--copies", type=int, default=16)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    setup_threads()
    device = torch.device(args.device)
    model = sevennet_model()
    case = AlchemiCase(model, real_crystals(args.copies, False), lambda k: Langevin(steps=k),
                       device, "32")  # fmt: skip
    batch = case.batch
    edges = model.neighbors(batch)  # held fixed: what a step between rebuilds sees
    vec = edges.vec.detach()
    edges = Edges(edges.i, edges.j, vec, edges.system, edges.cutoff)
    inside = int((vec.square().sum(-1) <= model.cutoff**2).sum())
    null = torch.zeros_like(vec)
    null[:, 0] = model.cutoff
    plugin = model.energy
    masked = null_edge_energy(model, null)

    def call(energy):
        model.energy = energy
        try:
            return model.energy_and_edge_gradient(batch, edges)
        finally:
            del model.energy  # (the instance attribute: back to the class's method)

    e_a, g_a = call(plugin)
    e_b, g_b = call(masked)
    scale = float(e_a.abs().max())
    row = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "systems": int(batch.num_systems), "atoms": int(batch.num_atoms),
        "list_pairs": len(vec), "pairs_within_cutoff": inside,
        "max_dE_rel": float((e_a - e_b).abs().max()) / scale,
        "max_dgrad": float((g_a - g_b).abs().max()), "max_grad": float(g_a.abs().max()),
    }  # fmt: skip
    row["a_plugin_ms"] = 1e3 * timed_calls(lambda: call(plugin), device, args.repeats)
    row["b_null_edges_ms"] = 1e3 * timed_calls(lambda: call(masked), device, args.repeats)
    if device.type == "cuda":
        static = {}
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up on the side stream, as torch's docs ask
                call(masked)
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static["out"] = call(masked)
        graph.replay()
        torch.cuda.synchronize(device)
        e_c = static["out"][0]
        row["c_graph_max_dE_rel"] = float((e_c - e_b).abs().max()) / scale
        row["c_graph_ms"] = 1e3 * timed_calls(graph.replay, device, args.repeats)
    print(json.dumps(row, indent=1))
    if args.json:
        args.json.write_text(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
