"""Count what goes through an MLIP, the same way in every engine.

Two probes, installed by patching a class's method for the duration of a ``with``
block (and restored after, even on error):

* :class:`NetworkProbe` wraps the *network's* ``forward`` (SevenNet's
  ``AtomGraphSequential``, MACE's ``ScaleShiftMACE``): every engine ends in that same
  call, whatever it wraps around it, so its counts -- calls, atoms, edges -- compare
  engines on equal terms.
* :class:`CallTimer` wraps the engine's *model call* (alchemi_lit ``Model.forward``,
  TorchSim ``ModelInterface.forward``, an ASE calculator's ``calculate``: each includes
  that engine's neighbour list, graph assembly, forward and backward) and sums its wall
  time; the run's wall time minus that is the engine's own framework time.

Only ``torch`` and the standard library: the TorchSim worker imports it too.
"""

from __future__ import annotations

import functools
import time
from typing import Any


def _first_dim(data: Any, keys: tuple[str, ...]) -> int:
    for key in keys:
        try:
            value = data[key]
        except (KeyError, TypeError, AttributeError):
            continue
        if value is not None and hasattr(value, "shape"):
            return int(value.shape[0])
    return 0


class NetworkProbe:
    """Counts calls, atoms and edges of ``cls.forward`` (its first argument after self
    is the input dictionary; ``atom_keys``/``edge_keys`` name the tensors whose first
    dimension is the atom count, and the ``[2, E]`` edge index)."""

    def __init__(
        self, cls: type, atom_keys: tuple[str, ...], edge_key: str, method: str = "forward"
    ) -> None:
        self.cls, self.method = cls, method
        self.atom_keys, self.edge_key = atom_keys, edge_key
        self.calls = self.atoms = self.edges = 0
        self.atoms_per_call: list[int] = []
        self._orig: Any = None

    def reset(self) -> None:
        self.calls = self.atoms = self.edges = 0
        self.atoms_per_call = []

    def __enter__(self) -> NetworkProbe:
        self._orig = orig = self.cls.__dict__[self.method]
        probe = self

        @functools.wraps(orig)
        def counted(net: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
            n = _first_dim(data, probe.atom_keys)
            try:
                e = int(data[probe.edge_key].shape[1])
            except (KeyError, TypeError, AttributeError, IndexError):
                e = 0
            probe.calls += 1
            probe.atoms += n
            probe.edges += e
            probe.atoms_per_call.append(n)
            return orig(net, data, *args, **kwargs)

        setattr(self.cls, self.method, counted)
        return self

    def __exit__(self, *exc: Any) -> None:
        setattr(self.cls, self.method, self._orig)


class CallTimer:
    """Sums the wall time spent in ``cls.<method>`` (outermost calls only)."""

    def __init__(self, cls: type, method: str) -> None:
        self.cls, self.method = cls, method
        self.seconds = 0.0
        self.calls = 0
        self._depth = 0
        self._orig: Any = None

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def __enter__(self) -> CallTimer:
        # the attribute as looked up on the class (may be inherited): restore exactly that
        self._own = self.method in self.cls.__dict__
        self._orig = orig = getattr(self.cls, self.method)
        timer = self

        @functools.wraps(orig)
        def timed(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if timer._depth:
                return orig(obj, *args, **kwargs)
            timer._depth += 1
            t0 = time.perf_counter()
            try:
                return orig(obj, *args, **kwargs)
            finally:
                timer.seconds += time.perf_counter() - t0
                timer.calls += 1
                timer._depth -= 1

        setattr(self.cls, self.method, timed)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._own:
            setattr(self.cls, self.method, self._orig)
        else:
            delattr(self.cls, self.method)


def sevennet_probe() -> NetworkProbe:
    """:class:`NetworkProbe` on SevenNet's ``AtomGraphSequential`` (any engine)."""
    import sevenn._keys as keys
    from sevenn.nn.sequential import AtomGraphSequential

    atom_keys = (keys.BATCH, keys.ATOMIC_NUMBERS, keys.NODE_FEATURE, keys.POS)
    return NetworkProbe(AtomGraphSequential, atom_keys, keys.EDGE_IDX)


def mace_probe() -> NetworkProbe:
    """:class:`NetworkProbe` on MACE's ``ScaleShiftMACE`` (any engine)."""
    from mace.modules.models import ScaleShiftMACE

    return NetworkProbe(ScaleShiftMACE, ("node_attrs", "batch"), "edge_index")


def counted_run(wall: float, probe: NetworkProbe, timer: CallTimer) -> dict[str, Any]:
    """The part of every engine's result that the probes measured: ``wall`` (s),
    ``model_s`` (s in the model call), ``forward_calls``, ``atoms_through``,
    ``edges_through`` and ``atoms_per_call`` on the network."""
    return {
        "wall": wall,
        "model_s": timer.seconds,
        "forward_calls": probe.calls,
        "atoms_through": probe.atoms,
        "edges_through": probe.edges,
        "atoms_per_call": list(probe.atoms_per_call),
    }
