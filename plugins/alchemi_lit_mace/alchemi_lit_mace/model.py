"""MACE (``mace-torch``) as a batched alchemi_lit model.

Why: MACE's ASE calculator evaluates one structure at a time and builds its graph with
matscipy on the host.  The MACE module itself takes a dictionary of tensors describing
any number of graphs (``batch``/``ptr`` per atom), so here it is fed directly from our
:class:`~alchemi_lit.core.state.Batch` and Verlet neighbour list: one forward for every
system in flight, on any device.

How it is fed: MACE computes edge vectors as ``positions[receiver] - positions[sender]
+ shifts``.  We pass ``positions = 0`` and ``shifts = our edge vectors`` (both directions,
pairs beyond the cutoff dropped), so MACE sees exactly our ``vec = r_j - r_i + shift``
with ``edge_index = [i, j]`` and its energy stays differentiable w.r.t. those vectors.
MACE's own force/stress autograd is switched off (``compute_force=False``): forces and
stress come from the base class's single backward pass on the edge vectors (MACE's
energy depends on positions only through them).  Pairs between ``r_max`` and
``r_max + skin`` are removed by indexing; MACE's polynomial cutoff would zero them, but
with the default 1 Å skin they are about 40 % of the list, edge work spent on nothing.

Where the model comes from (nothing is downloaded):

* ``random_init="small" | "medium"``: a randomly initialised ``ScaleShiftMACE`` with the
  MACE-MP-0 small/medium architecture (128 channels, L=0/1, max_ell 3, 2 interactions,
  correlation 3, r_max 6 Å, 89 elements: 3,847,696 / 4,688,656 parameters, as the
  published models).  Its energies are meaningless; its cost is that of MACE-MP-0, which
  makes it a throughput benchmark without the weights.
* ``model_path``: a local checkpoint, loaded safely (see :mod:`.checkpoint`); a bare
  ``state_dict`` file is accepted together with ``random_init`` (weights for that
  architecture).

Precision: by default the network follows the batch dtype (cast on the first call with
a new dtype), so ``precision="64"`` runs MACE in float64 and ``"32"`` in float32; pass
``dtype`` to pin it.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from alchemi_lit.core.state import Batch
from alchemi_lit.models.base import Model
from alchemi_lit.models.fx_slim import slim_graph_modules
from alchemi_lit.models.neighbors import Edges

from ._imports import import_mace
from .checkpoint import load_model

#: The 89 elements of MACE-MP-0 (those of MPtrj): H-Bi and Ac-Pu.
MP_ELEMENTS: tuple[int, ...] = (*range(1, 84), *range(89, 95))

#: MACE-MP-0 architecture (``mace_run_train`` arguments of the published small/medium
#: models); ``hidden_irreps`` per size.
MP_HIDDEN_IRREPS = {"small": "128x0e", "medium": "128x0e+128x1o"}
MP_ARCHITECTURE: dict[str, Any] = {
    "r_max": 6.0,
    "num_bessel": 10,
    "num_polynomial_cutoff": 5,
    "max_ell": 3,
    "interaction": "RealAgnosticResidualInteractionBlock",
    "interaction_first": "RealAgnosticResidualInteractionBlock",
    "num_interactions": 2,
    "MLP_irreps": "16x0e",
    "correlation": 3,
    "gate": "silu",
    "radial_MLP": [64, 64, 64],
    "avg_num_neighbors": 61.0,  # order of MPtrj's value; only rescales messages
}


def build_mace_mp(
    size: Literal["small", "medium"], seed: int = 0, dtype: torch.dtype = torch.float32
) -> torch.nn.Module:
    """A randomly initialised ``ScaleShiftMACE`` with the MACE-MP-0 ``size`` architecture.

    Deterministic for a given ``seed``; the global torch RNG is left untouched.
    """
    if size not in MP_HIDDEN_IRREPS:
        raise ValueError(f"random_init must be 'small' or 'medium', got {size!r}")
    modules = import_mace()
    from e3nn import o3

    arch = MP_ARCHITECTURE
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = modules.ScaleShiftMACE(
            r_max=arch["r_max"],
            num_bessel=arch["num_bessel"],
            num_polynomial_cutoff=arch["num_polynomial_cutoff"],
            max_ell=arch["max_ell"],
            interaction_cls=modules.interaction_classes[arch["interaction"]],
            interaction_cls_first=modules.interaction_classes[arch["interaction_first"]],
            num_interactions=arch["num_interactions"],
            num_elements=len(MP_ELEMENTS),
            hidden_irreps=o3.Irreps(MP_HIDDEN_IRREPS[size]),
            MLP_irreps=o3.Irreps(arch["MLP_irreps"]),
            atomic_energies=np.zeros(len(MP_ELEMENTS)),
            avg_num_neighbors=arch["avg_num_neighbors"],
            atomic_numbers=list(MP_ELEMENTS),
            correlation=arch["correlation"],
            gate=modules.gate_dict[arch["gate"]],
            radial_MLP=list(arch["radial_MLP"]),
            atomic_inter_scale=1.0,
            atomic_inter_shift=0.0,
        )
    return module.to(dtype)


def num_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


_DTYPES = {"float32": torch.float32, "float64": torch.float64}


class MACE(Model):
    """A MACE model (local checkpoint or random MACE-MP-0 architecture), batched.

    Args:
        model_path: a checkpoint written by :func:`alchemi_lit_mace.save_checkpoint`
            (read with ``weights_only=True``), a bare ``state_dict`` file (with
            ``random_init``), or -- only with ``trust_pickle=True`` -- a pickled MACE
            module (``*.model``).
        random_init: ``"small"`` or ``"medium"``: the MACE-MP-0 architecture with random
            weights (throughput benchmarks; no download).
        dtype: ``"float32"`` or ``"float64"`` to pin the network's precision; default:
            follow the batch.
        seed: seed of the random initialisation.
        trust_pickle: allow unpickling ``model_path`` (runs code from the file).
        skin: Verlet skin of the neighbour list (Å).
        compute_stress: return the stress in every call (else only when asked).
        slim_graphs: remove dead nodes and per-instruction slices from e3nn's generated
            tensor-product code (:mod:`alchemi_lit.models.fx_slim`): the same energies,
            forces equal to round-off, a cheaper backward pass.  ``False`` runs mace's
            graphs untouched.

    ``cpu_batch_atoms``: on a CPU, MACE-MP-0 (medium)'s time per atom is flat from ~64
    atoms per batch while each atom adds MBs of features, so the workflows batch single
    points in chunks of 128 atoms there (BENCHMARKS.md, "SevenNet-0 on a CPU: batch
    size", which has MACE's figures too).
    """

    cpu_batch_atoms = 128

    def __init__(
        self,
        model_path: str | None = None,
        random_init: Literal["small", "medium"] | None = None,
        dtype: Literal["float32", "float64"] | None = None,
        seed: int = 0,
        trust_pickle: bool = False,
        skin: float = 1.0,
        compute_stress: bool = True,
        slim_graphs: bool = True,
    ) -> None:
        if model_path is None and random_init is None:
            raise ValueError("give model_path (a local MACE checkpoint) or random_init")
        if dtype is not None and dtype not in _DTYPES:
            raise ValueError(f"dtype must be 'float32', 'float64' or None, got {dtype!r}")
        net = self._load(model_path, random_init, seed, trust_pickle)
        super().__init__(float(net.r_max), skin, compute_stress)
        net.eval()
        for p in net.parameters():
            p.requires_grad_(False)
        self.net = net
        self.slim_graphs = slim_graphs
        if slim_graphs:
            slim_graph_modules(net)
        self.model_path = model_path
        self.random_init = random_init
        self.compute_dtype = _DTYPES[dtype] if dtype is not None else None
        z = [int(v) for v in net.atomic_numbers]
        self.supported_elements = frozenset(z)
        self.num_elements = len(z)
        table = torch.full((max(z) + 1,), -1, dtype=torch.long)
        table[torch.tensor(z)] = torch.arange(len(z))
        self.register_buffer("z_to_index", table, persistent=False)

    @staticmethod
    def _load(
        model_path: str | None, random_init: str | None, seed: int, trust_pickle: bool
    ) -> torch.nn.Module:
        if model_path is None:
            return build_mace_mp(random_init, seed)  # type: ignore[arg-type]
        if not Path(model_path).is_file():
            raise FileNotFoundError(f"MACE model file not found: {model_path}")
        if random_init is not None:
            try:  # a bare state_dict for the random_init architecture?
                state = torch.load(model_path, map_location="cpu", weights_only=True)
            except pickle.UnpicklingError:  # not plain data: load_model explains below
                state = None
            if isinstance(state, dict) and all(isinstance(v, torch.Tensor) for v in state.values()):
                net = build_mace_mp(random_init, seed)  # type: ignore[arg-type]
                net.load_state_dict(state, strict=True)
                return net
        return load_model(model_path, trust_pickle=trust_pickle)

    @property
    def net_dtype(self) -> torch.dtype:
        return next(self.net.parameters()).dtype

    def energy(self, batch: Batch, edges: Edges) -> torch.Tensor:
        """Per-system energy ``[B]`` (eV), differentiable w.r.t. ``edges.vec``."""
        dtype = self.compute_dtype or batch.dtype
        if self.net_dtype != dtype:
            self.net.to(dtype)
        vec = edges.vec
        keep = (vec.square().sum(-1) <= self.cutoff**2).nonzero().squeeze(1)
        i, j = edges.i[keep], edges.j[keep]
        v = vec[keep].to(dtype)
        shifts = torch.cat([v, -v])
        n = batch.num_atoms
        kind = self.z_to_index[batch.atomic_numbers]
        data = {
            "positions": torch.zeros((n, 3), dtype=dtype, device=v.device),
            "shifts": shifts,
            "unit_shifts": torch.zeros_like(shifts),
            "edge_index": torch.stack([torch.cat([i, j]), torch.cat([j, i])]),
            "batch": batch.system_idx,
            "ptr": batch.ptr,
            "node_attrs": torch.nn.functional.one_hot(kind, self.num_elements).to(dtype),
            "cell": batch.cell.to(dtype).reshape(-1, 3),
        }
        out = self.net(data, training=False, compute_force=False)
        return out["energy"].to(batch.dtype)


__all__ = ["MACE", "MP_ARCHITECTURE", "MP_ELEMENTS", "build_mace_mp", "num_parameters"]
