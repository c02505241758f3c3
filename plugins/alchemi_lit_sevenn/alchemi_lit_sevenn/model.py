"""SevenNet (``sevenn``) as a batched alchemi_lit model.

Why this wrapper rather than ``sevenn.calculator.SevenNetCalculator``: the calculator
evaluates one ``ase.Atoms`` at a time and builds its graph with its own neighbour
list on the host.  SevenNet's network itself is a plain ``torch.nn.Module`` over a
dictionary of tensors that already supports several graphs at once (a ``batch``
index per atom), so here it is fed directly from our :class:`~alchemi_lit.core.state.Batch`
and Verlet neighbour list: every system in flight is evaluated in one forward, on
any device, with no per-structure Python loop and no per-step host-side graph build.

How the network is fed:

* The network (``AtomGraphSequential``) starts with ``EdgeEmbedding``, which reads the
  edge vectors ``edge_vec`` from the input dictionary; it never recomputes them from
  positions (only LAMMPS deployments prepend an ``EdgePreprocess``; any such module
  is removed here).  We pass our own edge vectors, in both directions
  (:meth:`Edges.directed`), with ``edge_index = [i, j]`` (SevenNet's
  ``edge_vec = pos[index[1]] - pos[index[0]]`` is our ``vec = r_j - r_i + shift``).
* SevenNet's own force/stress head (``ForceStressOutputFromEdge``) and its total-energy
  reduction are removed: the per-atom energies are summed per system here, and forces
  and stress come from the base class's autograd on the edge vectors (the same
  edge-gradient formula SevenNet uses, evaluated once for all systems).
* Pairs between ``cutoff`` and ``cutoff + skin`` must be masked: SevenNet's XPLOR
  cutoff function is *not* zero beyond the cutoff (it is a polynomial that the original
  neighbour list never evaluates there).  They are dropped by indexing, which also
  saves the network ~40 % of its edge work with the default 1 Å skin.
* e3nn's generated tensor-product code is slimmed (dead outer products removed, the
  per-instruction slices of the edge weights fused into one split) unless
  ``slim_graphs=False``: the backward pass no longer zero-fills a whole-size gradient
  per slice (see :mod:`alchemi_lit.models.fx_slim`).

Precision: SevenNet-0 was trained and ships in float32 and its one-hot embedding is
hard-coded to float32, so the network always runs in float32 (``.double()`` on this
model leaves the network in float32).  Edge vectors are cast to float32 on the way in;
energies, forces and stress come back in the batch's dtype.  With a float64 batch the
positions, neighbour list and integrator stay float64; only the network is float32.

Safe loading: checkpoints are read with ``torch.load(weights_only=True)``.  SevenNet's
checkpoints hold, besides tensors, a config dictionary with a few numpy arrays
(per-species shift/scale), so numpy's array reconstruction (``_reconstruct``,
``ndarray``, ``dtype`` and the plain numeric dtype classes) is allowlisted for that one
call only.  These rebuild arrays of numbers and run no code; nothing else is
allowlisted and torch's global safe-load settings are untouched.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from alchemi_lit.core.state import Batch
from alchemi_lit.models.base import Model, per_system_sum
from alchemi_lit.models.fx_slim import slim_graph_modules
from alchemi_lit.models.neighbors import Edges

#: Pretrained names understood by :class:`SevenNet` (lower case) -> sevenn's own name.
PRETRAINED = {
    "sevennet-0": "7net-0",
    "7net-0": "7net-0",
    "sevennet-0_11jul2024": "7net-0_11Jul2024",
    "sevennet-0_22may2024": "7net-0_22May2024",
    "sevennet-l3i5": "7net-l3i5",
    "7net-l3i5": "7net-l3i5",
}

#: Modules of a SevenNet network that this wrapper replaces (see module docstring).
_REPLACED_MODULES = (
    "EdgePreprocess",
    "ForceOutput",
    "ForceStressOutput",
    "ForceStressOutputFromEdge",
    "AtomReduce",
)


@contextlib.contextmanager
def _e3nn_import_guard() -> Iterator[None]:
    """Import e3nn (and so sevenn) under a one-element safe-load allowlist.

    e3nn 0.4.x (the version mace-torch pins) loads its Wigner constants at import with a
    bare ``torch.load``; since torch 2.6 that default is ``weights_only=True``, which
    rejects the ``slice`` objects stored in that file.  ``slice`` is inert data, so it
    is allowlisted for the duration of the import only; no environment variable is set.
    """
    with torch.serialization.safe_globals([slice]):
        yield


def _import_sevenn() -> Any:
    with _e3nn_import_guard():
        import e3nn.o3  # noqa: F401  (loads its constants under the guard)
        import sevenn._keys
        import sevenn.util
    return sevenn


def _numpy_safe_globals() -> list[Any]:
    """Globals that numpy arrays of plain numbers need under ``weights_only=True``."""
    import numpy as np

    try:  # numpy >= 2
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    safe: list[Any] = [
        (_reconstruct, "numpy.core.multiarray._reconstruct"),
        (_reconstruct, "numpy._core.multiarray._reconstruct"),
        np.ndarray,
        np.dtype,
    ]
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        for name in (
            "Float16DType", "Float32DType", "Float64DType", "Int8DType", "Int16DType",
            "Int32DType", "Int64DType", "UInt8DType", "BoolDType",
        ):  # fmt: skip
            if hasattr(dtypes, name):
                safe.append(getattr(dtypes, name))
    return safe


def checkpoint_path(checkpoint: str) -> str:
    """Path of a pretrained SevenNet checkpoint shipped in the ``sevenn`` wheel, or
    ``checkpoint`` itself if it is an existing file."""
    if os.path.isfile(checkpoint):
        return checkpoint
    name = PRETRAINED.get(checkpoint.lower())
    if name is None:
        raise ValueError(
            f"unknown SevenNet checkpoint {checkpoint!r}: give a file path or one of "
            f"{', '.join(sorted(PRETRAINED))}"
        )
    sevenn = _import_sevenn()
    path = sevenn.util.pretrained_name_to_path(name)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"the sevenn package has no file for {checkpoint!r} (looked for {path}); "
            f"reinstall sevenn, whose wheel ships the SevenNet-0 weights"
        )
    return path


def load_checkpoint(path: str) -> dict[str, Any]:
    """``torch.load`` a SevenNet checkpoint with ``weights_only=True`` (numpy allowlisted)."""
    try:
        with torch.serialization.safe_globals(_numpy_safe_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise RuntimeError(
            f"could not load SevenNet checkpoint {path} with torch.load(weights_only=True) "
            f"({type(exc).__name__}: {str(exc).splitlines()[0]}). alchemi_lit_sevenn does not "
            f"unpickle arbitrary objects; re-save the checkpoint as a dict of tensors and "
            f"plain values."
        ) from exc


def build_network(ckpt: dict[str, Any], path: str) -> tuple[torch.nn.Module, dict[str, Any]]:
    """SevenNet's network and config from a checkpoint dict loaded by :func:`load_checkpoint`.

    sevenn >= 0.11 reads checkpoints through ``SevenNetCheckpoint``, which would unpickle
    the file itself with ``weights_only=False``; it is handed the already (safely) loaded
    dict instead.  sevenn 0.10 builds directly from the dict.
    """
    sevenn = _import_sevenn()
    try:
        from sevenn.checkpoint import SevenNetCheckpoint, _config_cp_routine
    except ImportError:  # sevenn 0.10
        return sevenn.util.model_from_checkpoint(ckpt)
    cp = SevenNetCheckpoint(path)
    cp._config_original = ckpt.get("config", {})
    cp._model_state_dict = ckpt.get("model_state_dict", {})
    cp._optimizer_state_dict = {}
    cp._scheduler_state_dict = {}
    cp._epoch = ckpt.get("epoch")
    cp._time = ckpt.get("time", "Not found")
    cp._hash = ckpt.get("hash", "Not found")
    cp._config = _config_cp_routine(cp._config_original)
    cp._loaded = True
    return cp.build_model(), cp.config


class SevenNet(Model):
    """SevenNet (default: SevenNet-0, 89 elements, 5 Å cutoff), all systems in one forward.

    On a CPU its time per atom is flat from ~64 atoms per batch on while each atom adds
    ~6 MB of features and gradients, and memory touched for the first time is costly;
    ``cpu_batch_atoms`` tells the workflows to batch single points in small chunks
    there (the figures: BENCHMARKS.md, "SevenNet-0 on a CPU: batch size").

    Args:
        checkpoint: a pretrained name (``"sevennet-0"``, ``"sevennet-0_22may2024"``,
            ``"sevennet-l3i5"``) whose weights ship inside the ``sevenn`` wheel, or the path
            of a SevenNet checkpoint file.  Nothing is downloaded.
        skin: Verlet skin of the neighbour list (Å).
        compute_stress: return the stress in every call (else only when asked).
        slim_graphs: remove dead nodes and per-instruction slices from e3nn's generated
            tensor-product code (:mod:`alchemi_lit.models.fx_slim`): the same energies,
            forces equal to float32 round-off, a cheaper backward pass.  ``False`` runs
            sevenn's graphs untouched.
    """

    cpu_batch_atoms = 128

    def __init__(
        self,
        checkpoint: str = "sevennet-0",
        skin: float = 1.0,
        compute_stress: bool = True,
        slim_graphs: bool = True,
    ) -> None:
        sevenn = _import_sevenn()
        keys = sevenn._keys
        path = checkpoint_path(checkpoint)
        ckpt = load_checkpoint(path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # sevenn's notes on old config keys
            net, config = build_network(ckpt, path)
        if getattr(net, "modal_map", None):
            raise ValueError(
                f"{path} is a multi-fidelity SevenNet model (modalities "
                f"{sorted(net.modal_map)}); alchemi_lit_sevenn supports single-fidelity models"
            )
        super().__init__(float(config[keys.CUTOFF]), skin, compute_stress)
        self.checkpoint = path
        self.sevenn_version = str(config.get("version", "unknown"))
        for name, module in list(net._modules.items()):
            if type(module).__name__ in _REPLACED_MODULES:
                if type(module).__name__ == "AtomReduce" and float(module.constant) != 1.0:
                    raise ValueError(f"unsupported SevenNet energy reduction constant {name}")
                net.delete_module_by_key(name)
        net.key_grad = None  # the base class owns the gradient w.r.t. edge vectors
        net.set_is_batch_data(True)
        # sevenn keeps its Z -> type table as a plain attribute and copies it to the
        # device in every call; as a buffer it moves with the model once.
        table = net.z_to_onehot_tensor
        del net.z_to_onehot_tensor
        net.register_buffer("z_to_onehot_tensor", table, persistent=False)
        for name, module in list(net._modules.items()):
            if type(module).__name__ == "OnehotEmbedding":
                net._modules[name] = OneHotWithoutReads(module)
        net.eval()
        for p in net.parameters():
            p.requires_grad_(False)
        self.net = net.float()
        self.slim_graphs = slim_graphs
        if slim_graphs:
            slim_graph_modules(self.net)
        type_map: dict[int, int] = {int(z): int(i) for z, i in config[keys.TYPE_MAP].items()}
        self.supported_elements = frozenset(type_map)
        self._key_z = keys.ATOMIC_NUMBERS
        self._key_index = keys.EDGE_IDX
        self._key_vec = keys.EDGE_VEC
        self._key_batch = keys.BATCH
        self._key_atomic_energy = keys.ATOMIC_ENERGY

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> SevenNet:
        # Device moves apply as usual; dtype casts must not reach the float32 network
        # (its one-hot embedding is hard-coded to float32).
        super()._apply(fn, *args, **kwargs)
        if any(p.dtype != torch.float32 for p in self.net.parameters()):
            self.net.float()
        return self

    def energy(self, batch: Batch, edges: Edges) -> torch.Tensor:
        """Per-system energy ``[B]`` (eV), differentiable w.r.t. ``edges.vec``."""
        vec = edges.vec
        inside = vec.square().sum(-1) <= self.cutoff**2
        keep = inside.nonzero().squeeze(1)  # drop skin pairs (see module docstring)
        return self.pairs_energy(batch, edges.i[keep], edges.j[keep], vec[keep])

    def pairs_energy(
        self, batch: Batch, i: torch.Tensor, j: torch.Tensor, vec: torch.Tensor
    ) -> torch.Tensor:
        """Per-system energy ``[B]`` of the network on the pairs ``(i, j)`` with vectors
        ``vec`` (each pair once, sent in both directions; all within the cutoff, or at
        exactly the cutoff, where they add nothing)."""
        v = vec.to(torch.float32)
        data = {
            self._key_z: batch.atomic_numbers,
            self._key_index: torch.stack([torch.cat([i, j]), torch.cat([j, i])]),
            self._key_vec: torch.cat([v, -v]),
            self._key_batch: batch.system_idx,
        }
        out = self.net(data)
        e_atom = out[self._key_atomic_energy].reshape(-1).to(batch.dtype)
        return per_system_sum(e_atom, batch.system_idx, batch.num_systems)


class OneHotWithoutReads(torch.nn.Module):
    """sevenn's ``OnehotEmbedding`` without ``torch.nn.functional.one_hot``, which reads
    the input's min and max on the host (two GPU syncs a forward) to check the classes;
    the types here come from the model's own Z table, so a comparison with ``arange``
    gives the same 0/1 rows without them."""

    def __init__(self, original: torch.nn.Module) -> None:
        super().__init__()
        self.num_classes = int(original.num_classes)
        self.key_x, self.key_output = original.key_x, original.key_output
        self.key_save = original.key_save
        self.key_additional_output = original.key_additional_output

    def forward(self, data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        inp = data[self.key_x]
        classes = torch.arange(self.num_classes, device=inp.device, dtype=inp.dtype)
        embd = (inp.unsqueeze(-1) == classes).float()
        data[self.key_output] = embd
        if self.key_additional_output is not None:
            data[self.key_additional_output] = embd  # for self-connection
        if self.key_save is not None:
            data[self.key_save] = inp  # for elemwise shift scale
        return data


__all__ = ["PRETRAINED", "SevenNet", "build_network", "checkpoint_path", "load_checkpoint"]
