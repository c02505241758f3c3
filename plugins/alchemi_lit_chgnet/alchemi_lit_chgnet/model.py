"""CHGNet (``chgnet``) as a batched alchemi_lit model.

Why this wrapper rather than ``chgnet.model.dynamics.CHGNetCalculator``: the calculator
evaluates one ``ase.Atoms`` at a time, converting it to a pymatgen ``Structure`` and
building its crystal graph on the host (pymatgen neighbour list, then a C routine and
Python loops per structure).  CHGNet's network itself (``CHGNet._compute``) takes one
``BatchedGraph`` of any number of crystals.  Here that batched graph is built directly,
in torch, from our :class:`~alchemi_lit.core.state.Batch` and Verlet neighbour list: every
system in flight is evaluated in one forward, on any device, with no per-structure
Python loop.

How the graph is built (what CHGNet's converter and ``BatchedGraph.from_graphs`` make):

* **Atom graph.**  Our half list holds each pair once, ``vec = r_j - r_i + shift``.
  Pairs shorter than ``atom_graph_cutoff`` (6 Å) are CHGNet's undirected bonds; each
  gives two directed edges, ``i -> j`` and ``j -> i`` (``directed2undirected`` maps both
  to the bond).  Pairs between the cutoff and cutoff + skin are dropped before the
  network: CHGNet's smooth cutoff makes their contribution exactly zero, but they would
  cost edge work.  (Likewise a pair at exactly the cutoff, which CHGNet's converter
  keeps and this drops: tested at r == 6 Å.)
* **Bond features.**  The radial Bessel bases of the atom and bond graphs
  (``rbf_expansion_ag`` / ``_bg`` of CHGNet's ``BondEncoder``) of the bond lengths;
  CHGNet's bond vector of a directed edge is ``centre - neighbour``, i.e. ``-vec`` for
  ``i -> j`` and ``vec`` for ``j -> i``, normalised.
* **Bond graph (angles).**  Every ordered pair of two different directed edges that
  leave the same atom and are both shorter than ``bond_graph_cutoff`` (3 Å), as in
  CHGNet's ``line_graph_adjacency_list``; its angle bases come from CHGNet's
  ``AngleEncoder`` of the two normalised bond vectors.  Built by sorting the short
  edges by centre atom and pairing within each centre.  (Angles with a longer bond
  would contribute zero too -- the bond-graph basis vanishes at its cutoff -- but their
  number grows with the square of the neighbour count.)
* **Energy.**  ``CHGNet._compute`` with forces and stress switched off, plus the
  composition model's per-element reference energies, times the atom count for
  intensive models, exactly as ``CHGNet.forward`` and the calculator combine them.

Forces and stress come from the base class's backward pass on the edge vectors
(CHGNet's energy depends on positions and cell only through the bond vectors), the
same quantities CHGNet differentiates with respect to positions and strain.  Magnetic
moments (``task="m"``) are not computed.

Precision: the network follows the batch dtype (cast on the first call with a new
dtype), so ``precision="64"`` runs CHGNet in float64 and ``"32"`` in float32, the
precision its calculator uses.

Safe loading: the pretrained checkpoints (shipped inside the ``chgnet`` wheel) are read
with ``torch.load(weights_only=True)`` -- they hold only dictionaries, tensors and plain
values -- instead of CHGNet's own ``from_file``, which unpickles arbitrary objects.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import torch

from alchemi_lit.core.state import Batch
from alchemi_lit.models.base import Model
from alchemi_lit.models.neighbors import Edges

#: Pretrained CHGNet versions whose weights ship in the ``chgnet`` wheel -> file, relative
#: to the package's ``pretrained`` folder (the names ``CHGNet.load`` accepts).
PRETRAINED = {
    "0.3.0": "0.3.0/chgnet_0.3.0_e29f68s314m37.pth.tar",
    "0.2.0": "0.2.0/chgnet_0.2.0_e30f77s348m32.pth.tar",
    "r2scan": "r2scan/chgnet_r2scan_transfer_learning_e15f36s161m23.pth.tar",
}


def checkpoint_path(model: str) -> str:
    """Path of a pretrained CHGNet checkpoint inside the ``chgnet`` package, or ``model``
    itself if it is an existing file."""
    if os.path.isfile(model):
        return model
    name = PRETRAINED.get(model.lower())
    if name is None:
        raise ValueError(
            f"unknown CHGNet model {model!r}: give a checkpoint file or one of "
            f"{', '.join(sorted(PRETRAINED))}"
        )
    import chgnet

    path = os.path.join(os.path.dirname(chgnet.__file__), "pretrained", name)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"the chgnet package has no file for {model!r} (looked for {path}); reinstall "
            f"chgnet, whose wheel ships the pretrained weights"
        )
    return path


def load_network(model: str) -> torch.nn.Module:
    """CHGNet's network from a pretrained name or checkpoint, loaded with
    ``weights_only=True`` (nothing is downloaded, no object is unpickled)."""
    from chgnet.model import CHGNet as Network

    path = checkpoint_path(model)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        params = state["model"]
    except (pickle.UnpicklingError, KeyError, TypeError) as exc:
        raise RuntimeError(
            f"could not load CHGNet checkpoint {path} with torch.load(weights_only=True) "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            f"alchemi_lit_chgnet reads checkpoints saved by CHGNet (a dict with "
            f"model/state_dict and model/model_args) and unpickles no objects"
        ) from exc
    # as CHGNet.load does: the 0.2.0 weights were trained with a bias in the readout
    kwargs: dict[str, Any] = {"mlp_out_bias": model == "0.2.0"}
    if model in PRETRAINED:
        kwargs["version"] = model
    net = Network.from_dict(params, **kwargs)
    net.eval()
    for p in net.parameters():
        p.requires_grad_(False)
    return net


class CHGNet(Model):
    """CHGNet universal potential, every system in flight in one forward.

    Default: the pretrained CHGNet 0.3.0 (elements H-Pu, 6 Å cutoff).  See the module
    docstring for how the graph is built.

    Args:
        model: a pretrained version (``"0.3.0"``, ``"0.2.0"``, ``"r2scan"``) whose
            weights ship inside the ``chgnet`` wheel, or the path of a CHGNet checkpoint
            file.  Nothing is downloaded.
        skin: Verlet skin of the neighbour list (Å).
        compute_stress: return the stress in every call (else only when asked).
    """

    def __init__(
        self, model: str = "0.3.0", skin: float = 1.0, compute_stress: bool = True
    ) -> None:
        net = load_network(model)
        converter = net.graph_converter
        super().__init__(float(converter.atom_graph_cutoff), skin, compute_stress)
        self.net = net
        self.model_name = model
        self.bond_cutoff = float(converter.bond_graph_cutoff)
        n_elements = net.atom_embedding.embedding.num_embeddings
        self.supported_elements = frozenset(range(1, n_elements + 1))

    def _network(self, dtype: torch.dtype) -> torch.nn.Module:
        if next(self.net.parameters()).dtype != dtype:
            self.net.to(dtype)
        return self.net

    def energy(self, batch: Batch, edges: Edges) -> torch.Tensor:
        """Per-system energy ``[B]`` (eV), differentiable w.r.t. ``edges.vec``."""
        from chgnet.model.model import BatchedGraph

        net = self._network(batch.dtype)
        vec = edges.vec
        keep = (vec.square().sum(-1) < self.cutoff**2).nonzero().squeeze(1)
        i, j, vec = edges.i[keep], edges.j[keep], vec[keep]
        n_bonds = len(keep)
        length = vec.norm(dim=-1)
        unit = vec / length.unsqueeze(-1)
        centre = torch.cat([i, j])  # directed edges: i -> j, then j -> i
        bond_of = torch.arange(n_bonds, device=vec.device).repeat(2)
        bond_vectors = torch.cat([-unit, unit])  # CHGNet's centre - neighbour, normalised
        first, second = _angle_pairs(centre, torch.cat([length, length]), self.bond_cutoff)
        if len(first):
            angle_bases = net.angle_basis_expansion(bond_vectors[first], bond_vectors[second])
        else:
            angle_bases = vec.new_zeros(0)
        encoder = net.bond_basis_expansion
        graph = BatchedGraph(
            atomic_numbers=batch.atomic_numbers,
            bond_bases_ag=encoder.rbf_expansion_ag(length),
            bond_bases_bg=encoder.rbf_expansion_bg(length),
            angle_bases=angle_bases,
            batched_atom_graph=torch.stack([centre, torch.cat([j, i])], 1),
            batched_bond_graph=torch.stack([centre[first], bond_of[first], bond_of[second]], 1),
            atom_owners=batch.system_idx,
            directed2undirected=bond_of,
            atom_positions=[],
            strains=[],
            volumes=batch.volume,
        )
        energy = net._compute(graph, compute_force=False, compute_stress=False)["e"]
        energy = energy + self._reference_energy(batch, net)
        return energy * batch.n_atoms.to(energy.dtype) if net.is_intensive else energy

    @staticmethod
    def _reference_energy(batch: Batch, net: torch.nn.Module) -> torch.Tensor | float:
        """The composition model's energy per system (per atom if it is intensive), as
        ``AtomRef`` computes it from each structure's element counts."""
        ref = net.composition_model
        if ref is None:
            return 0.0
        counts = batch.positions.new_zeros(batch.num_systems, ref.max_num_elements)
        ones = torch.ones_like(batch.atomic_numbers, dtype=counts.dtype)
        counts.index_put_((batch.system_idx, batch.atomic_numbers - 1), ones, accumulate=True)
        if ref.is_intensive:
            counts = counts / batch.n_atoms.to(counts.dtype).unsqueeze(-1)
        return ref._get_energy(counts)


def _angle_pairs(
    centre: torch.Tensor, length: torch.Tensor, cutoff: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ordered pairs ``(first, second)`` of different directed edges that leave the same
    atom and are both shorter than ``cutoff`` (CHGNet's bond graph), as edge indices."""
    short = (length < cutoff).nonzero().squeeze(1)
    short = short[torch.argsort(centre[short], stable=True)]
    owner = centre[short]
    n_atoms = int(centre.max()) + 1 if len(centre) else 0
    per_atom = torch.bincount(owner, minlength=n_atoms)
    start = torch.cumsum(per_atom, 0) - per_atom
    partners = per_atom[owner]  # edges sharing each short edge's centre (itself included)
    total = int(partners.sum())
    a = torch.repeat_interleave(torch.arange(len(short), device=short.device), partners)
    offset = torch.arange(total, device=short.device) - torch.repeat_interleave(
        torch.cumsum(partners, 0) - partners, partners, output_size=total
    )
    b = start[owner[a]] + offset
    distinct = a != b
    return short[a[distinct]], short[b[distinct]]


__all__ = ["PRETRAINED", "CHGNet", "checkpoint_path", "load_network"]
