"""Operations with a torch reference and faster implementations that backends register.

Why: the physics of an operation (a kick, a FIRE update, the keyed noise) is written
once, in torch -- every device, autograd, ``torch.compile``.  A backend such as the numba
CPU kernels of :mod:`alchemi_lit.kernels` registers a faster implementation of the same
operation together with a test of the inputs it takes (CPU tensors, a dtype it computes
with, no graph); a call runs the first registered implementation that takes its inputs,
else the reference.  The code that calls an operation never names a backend, and a
backend is held equal to the reference by tests.  (JAX-MD dispatches its primitives by
platform the same way.)

The built-in backends (:data:`BUILTIN`) are imported on the first call of any
primitive, as the plugin registry imports the built-in plugins: a low layer defines the
operation, the backend above it registers into it, and nothing imports upwards.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

#: modules that register implementations when imported (on the first primitive call)
BUILTIN: tuple[str, ...] = (
    "alchemi_lit.kernels.backend", "alchemi_lit.kernels.constraint_backend",
    "alchemi_lit.kernels.observables_backend",
)  # fmt: skip
_loaded = False


class Implementation(NamedTuple):
    backend: str
    accepts: Callable[..., bool]
    run: Callable[..., Any]


class Primitive(Generic[P, R]):
    """An operation: calling it runs a registered implementation that accepts the
    arguments, else the torch :attr:`reference` (see the module docstring)."""

    def __init__(self, reference: Callable[P, R]) -> None:
        functools.update_wrapper(self, reference)
        self.reference = reference
        self.implementations: list[Implementation] = []

    def register(
        self, backend: str, accepts: Callable[..., bool]
    ) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Decorator: ``fn`` runs instead of the reference when ``accepts(*args,
        **kwargs)`` is true (registered again under the same ``backend``: replaced)."""

        def add(fn: Callable[P, R]) -> Callable[P, R]:
            kept = [i for i in self.implementations if i.backend != backend]
            self.implementations = [*kept, Implementation(backend, accepts, fn)]
            return fn

        return add

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """The backend that would run these arguments (``"torch"``: the reference)."""
        _load_builtin()
        for impl in self.implementations:
            if impl.accepts(*args, **kwargs):
                return impl.backend
        return "torch"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if not _loaded:
            _load_builtin()
        for impl in self.implementations:  # (a plain loop: runs several times a step)
            if impl.accepts(*args, **kwargs):
                return impl.run(*args, **kwargs)
        return self.reference(*args, **kwargs)

    def __repr__(self) -> str:
        names = ", ".join(i.backend for i in self.implementations) or "none"
        return f"<primitive {self.reference.__qualname__} (backends: {names})>"


def primitive(reference: Callable[P, R]) -> Primitive[P, R]:
    """Decorator: make the torch function ``reference`` a :class:`Primitive`."""
    return Primitive(reference)


def _load_builtin() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for name in BUILTIN:
            importlib.import_module(name)


__all__ = ["BUILTIN", "Implementation", "Primitive", "primitive"]
