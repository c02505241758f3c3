"""Hook stages, the Callback base class and dispatch every ``every`` loop steps.

A step runs the stages in this order::

    BEFORE_STEP
      BEFORE_PRE_UPDATE   -> integrators' pre_update ->   AFTER_PRE_UPDATE
      BEFORE_COMPUTE      -> one model forward       ->   AFTER_COMPUTE
      BEFORE_POST_UPDATE  -> integrators' post_update ->  AFTER_POST_UPDATE
    AFTER_STEP
    ON_CONVERGE           (at bookkeeping, when systems left a stage since the last one)

plus ``on_run_start`` / ``on_run_end``.  A callback subscribes to a stage by
overriding the method of that name (``after_step``, ``before_compute`` ...), as in
Lightning; only overridden methods are ever called, so an unused hook costs nothing.
``every`` gates calls on the loop step (``ctx.step % every == 0``); ON_CONVERGE
is an event and always reaches its subscribers.

Callbacks read the batch.  One that changes state (NaN quarantine, a bias force, a
clamp) must say so in its docstring and set ``modifies_state = True``, so nobody
changes control flow by accident (DESIGN invariant 6).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    from ..core.state import Batch


class HookStageEnum(enum.Enum):
    """The nine points of a step where callbacks run, in execution order."""

    BEFORE_STEP = "before_step"
    BEFORE_PRE_UPDATE = "before_pre_update"
    AFTER_PRE_UPDATE = "after_pre_update"
    BEFORE_COMPUTE = "before_compute"
    AFTER_COMPUTE = "after_compute"
    BEFORE_POST_UPDATE = "before_post_update"
    AFTER_POST_UPDATE = "after_post_update"
    AFTER_STEP = "after_step"
    ON_CONVERGE = "on_converge"

    # members are singletons compared by identity: hash them so too, in C (Enum's own
    # __hash__ is a Python call, paid at every dispatch -- eight a step)
    __hash__ = object.__hash__


@dataclass
class StepContext:
    """What a callback sees.  One object per run, updated in place every step.

    ``stage_masks[k]`` is the ``[B]`` mask of systems whose status is stage code ``k``
    at the start of the step.  ``exited``/``converged`` (set for ON_CONVERGE) mark
    systems that left a stage since the previous bookkeeping, ``converged`` those that
    met an optimizer criterion; ``graduated`` marks systems about to leave the batch.
    ``exit_code`` is the status of finished systems; ``total_systems``/``total_atoms``
    what the run will process when known (one device), ``graduated_systems`` how many
    left so far, ``rank`` the pipeline rank (None on one device).  ``state`` is the
    same as a mapping (the form these had before; other keys go to ``extras``).
    """

    batch: Batch
    step: int = 0
    stages: Sequence[Any] = ()
    stage_masks: list[torch.Tensor] = field(default_factory=list)
    exited: torch.Tensor | None = None
    converged: torch.Tensor | None = None
    graduated: torch.Tensor | None = None
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    simulator: Any = None
    exit_code: int = -1
    has_fixed: bool = False
    constraint_bits: int = 0
    total_systems: int | None = None
    total_atoms: int | None = None
    graduated_systems: int = 0
    rank: int | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def stage_of(self, code: int) -> torch.Tensor:
        """Mask ``[B]`` of systems currently in stage ``code``."""
        return self.batch.status == code

    @property
    def state(self) -> MutableMapping[str, Any]:
        """The run's context as a mapping: typed fields by name (absent while None),
        anything else kept in ``extras``."""
        return _ContextView(self)


_TYPED = (
    "exit_code", "has_fixed", "constraint_bits", "total_systems", "total_atoms",
    "graduated_systems", "rank",
)  # fmt: skip


class _ContextView(MutableMapping):
    """:attr:`StepContext.state`: a dict-like view of the typed fields plus ``extras``."""

    def __init__(self, ctx: StepContext) -> None:
        self._ctx = ctx

    def __getitem__(self, key: str) -> Any:
        if key in _TYPED:
            value = getattr(self._ctx, key)
            if value is None:
                raise KeyError(key)
            return value
        return self._ctx.extras[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key in _TYPED:
            setattr(self._ctx, key, value)
        else:
            self._ctx.extras[key] = value

    def __delitem__(self, key: str) -> None:
        if key in _TYPED:
            setattr(self._ctx, key, None)
        else:
            del self._ctx.extras[key]

    def __iter__(self) -> Iterator[str]:
        typed = [k for k in _TYPED if getattr(self._ctx, k) is not None]
        return iter([*typed, *self._ctx.extras])

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Callback:
    """Base class: override the hook methods you need (see module docstring)."""

    #: True for callbacks that write to the batch (documented in their docstring).
    modifies_state: ClassVar[bool] = False
    #: True for callbacks whose step hooks only launch device work that depends on
    #: nothing but tensors (no host read, no Python state that changes per step):
    #: ``Simulator(cuda_graphs=True)`` captures them with the step.  Steps where any
    #: other callback's hook fires run eagerly.
    graph_safe: ClassVar[bool] = False

    def __init__(self, every: int = 1) -> None:
        if int(every) < 1:
            raise ValueError(f"{type(self).__name__}: every must be >= 1, got {every}")
        self.every = int(every)

    def on_run_start(self, ctx: StepContext) -> None:
        """Called once before the first step (forces already computed)."""

    def on_run_end(self, ctx: StepContext) -> None:
        """Called once after the last step, also when the run fails."""

    def before_step(self, ctx: StepContext) -> None: ...
    def before_pre_update(self, ctx: StepContext) -> None: ...
    def after_pre_update(self, ctx: StepContext) -> None: ...
    def before_compute(self, ctx: StepContext) -> None: ...
    def after_compute(self, ctx: StepContext) -> None: ...
    def before_post_update(self, ctx: StepContext) -> None: ...
    def after_post_update(self, ctx: StepContext) -> None: ...
    def after_step(self, ctx: StepContext) -> None: ...
    def on_converge(self, ctx: StepContext) -> None: ...

    def hook_stages(self) -> list[HookStageEnum]:
        """Stages this callback subscribes to: the hook methods it overrides."""
        return [
            s
            for s in HookStageEnum
            if getattr(type(self), s.value) is not getattr(Callback, s.value)
        ]

    def hook_method(self, stage: HookStageEnum) -> Callable[[StepContext], None]:
        """The function called at ``stage`` (the method named after it)."""
        return getattr(self, stage.value)

    def state_dict(self) -> dict[str, Any]:
        """State to checkpoint (counters, file positions); tensors or plain values."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


class LambdaCallback(Callback):
    """A function as a callback on one stage: ``LambdaCallback(HookStageEnum.AFTER_STEP, fn)``."""

    def __init__(
        self, stage: HookStageEnum, fn: Callable[[StepContext], None], every: int = 1
    ) -> None:
        super().__init__(every)
        self.stage = HookStageEnum(stage)
        self.fn = fn

    def hook_stages(self) -> list[HookStageEnum]:
        return [self.stage]

    def hook_method(self, stage: HookStageEnum) -> Callable[[StepContext], None]:
        return self.fn


class HookDispatcher:
    """Calls the subscribed callbacks of a stage, in registration order, every ``every`` steps."""

    def __init__(self, callbacks: Sequence[Callback]) -> None:
        self.callbacks = list(callbacks)
        self._table: dict[HookStageEnum, list[tuple[int, Callable[[StepContext], None]]]] = {
            s: [] for s in HookStageEnum
        }
        for cb in self.callbacks:
            if not isinstance(cb, Callback):
                raise TypeError(f"callbacks must be Callback instances, got {type(cb).__name__}")
            for s in cb.hook_stages():
                self._table[s].append((cb.every, cb.hook_method(s)))

    def has(self, stage: HookStageEnum) -> bool:
        return bool(self._table[stage])

    def __call__(self, stage: HookStageEnum, ctx: StepContext) -> None:
        if stage is HookStageEnum.ON_CONVERGE:  # an event, not a step: never skipped,
            for _, fn in self._table[stage]:  # or exits between two gated steps are lost
                fn(ctx)
            return
        for freq, fn in self._table[stage]:
            if ctx.step % freq == 0:
                fn(ctx)

    def run_start(self, ctx: StepContext) -> None:
        for cb in self.callbacks:
            cb.on_run_start(ctx)

    def run_end(self, ctx: StepContext) -> None:
        """Every callback's ``on_run_end``, even when one raises (the first error is re-raised)."""
        error: BaseException | None = None
        for cb in self.callbacks:
            try:
                cb.on_run_end(ctx)
            except BaseException as exc:
                error = error or exc
        if error is not None:
            raise error


def callback_states(callbacks: Sequence[Callback]) -> list[list[Any]]:
    """``[[class name, state], ...]`` of every callback, for a checkpoint."""
    return [[type(cb).__name__, cb.state_dict()] for cb in callbacks]


def restore_callback_states(callbacks: Sequence[Callback], saved: list[list[Any]]) -> None:
    """Each callback takes the next saved state of its class (callbacks added or removed
    since the checkpoint start fresh)."""
    pending = list(saved)
    for cb in callbacks:
        for k, (name, state) in enumerate(pending):
            if name == type(cb).__name__:
                cb.load_state_dict(state)
                del pending[k]
                break
