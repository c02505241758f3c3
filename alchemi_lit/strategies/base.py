"""Strategy: how a :class:`~alchemi_lit.Simulator` executes its plan (devices, ranks,
the step loop).  Strategies are plugins of kind ``"strategy"``.

Built-ins: ``single`` (one device, fused plan, inflight batching), ``pipeline`` (one
rank per pipeline stage) and ``replicas`` (copies of the plan over shards of the
data).  ``strategy="auto"`` (the default) is not a class: the Simulator picks
``pipeline`` for pipeline plans (``a | b``) and ``single`` otherwise.  Names are a
closed set: a name that is neither ``auto`` nor registered is rejected with the list
of valid ones.

A strategy plugin subclasses :class:`Strategy`, registers it and implements

* ``run(sim, data, resume)`` (required): run every system and return
  :class:`~alchemi_lit.io.results.Results`.  ``data`` is what the user passed to
  ``Simulator.run`` (a Batch, an ``ase.Atoms``, a list of them or a
  :class:`~alchemi_lit.data.SizeAwareSampler`); ``resume`` a checkpoint path or None.
  ``sim`` is fully wired (``sim.model``, ``sim.plan``, ``sim.device``, ``sim.dtype``,
  ``sim.callbacks``, ``sim.sinks``, ``sim.seed``, ``sim.sync_every`` ...);
  :meth:`SingleDeviceStrategy.run` can do the actual stepping for a one-process
  strategy.
* ``setup(sim, plan)`` (optional): called by ``Simulator.__init__`` before anything
  runs, with the constructor's settings on ``sim`` (``sim.accelerator``,
  ``sim.devices``, ``sim.num_devices``, ``sim.buffer``, ``sim.comm_mode``,
  ``sim.timeout`` ...; not yet ``sim.device``).  Raise
  :class:`~alchemi_lit.core.errors.ConfigError` naming the problem when the strategy cannot
  run ``plan``; return the plan to run (``sim.plan``).  The default accepts a fused
  plan on one device.

A config names a strategy by its registered name (``strategy: my-strategy``), so the
class must be constructible without arguments; options go into presets
(``register_preset("strategy", "my-fast", MyStrategy, chunk=64)``) or, in Python,
into an instance (``Simulator(..., strategy=MyStrategy(chunk=64))``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from ..core.errors import ConfigError
from ..integrators.stages import Fused, Pipeline

if TYPE_CHECKING:
    from ..io.results import Results
    from ..simulator import Simulator

AUTO = "auto"


class Strategy(ABC):
    """Base of execution strategies (see the module docstring for the interface)."""

    #: the name it is known by (set to the registered name when built from one)
    name: str = ""

    def setup(self, sim: Simulator, plan: Fused | Pipeline) -> Fused | Pipeline:
        """Check that this strategy can run ``plan`` with ``sim``'s settings; return the
        plan to run.  Default: a fused plan on one device."""
        if isinstance(plan, Pipeline):
            raise ConfigError(
                "a pipeline plan (a | b) runs one stage per rank: use strategy='pipeline' "
                "(or combine stages with '+' to run them fused on one device)"
            )
        if sim.num_devices > 1:
            raise ConfigError(
                f"devices={sim.devices} asks for {sim.num_devices} ranks but the plan is fused "
                f"and runs on one device; use devices=1, the 'replicas' strategy (copies of the "
                f"plan on shards of the data) or a pipeline plan with one stage per device"
            )
        return plan

    def salvage_before_restart(self, sim: Simulator) -> None:
        """Before a run restarts without a checkpoint (``Simulator.run(resume=...)``
        with none to resume from): gather finished results it left anywhere other than
        its sinks' stores into them, so those systems are not computed again.  Default:
        nothing (a one-process run writes its stores directly)."""
        return None

    def replica_period(self) -> int | None:
        """Ranks per replica when this runs replicas of one plan (their results share
        the base plan's stage columns); None otherwise."""
        return None

    @abstractmethod
    def run(self, sim: Simulator, data: Any, resume: str | None = None) -> Results:
        """Run every system of ``data`` through ``sim.plan``; see the module docstring."""


def strategy_names() -> list[str]:
    """Every valid ``strategy`` value: ``auto`` and the registered names."""
    from ..core import registry

    return [AUTO, *sorted(registry.REGISTRIES["strategy"].names(), key=str.lower)]


def check_strategy_name(name: str) -> None:
    """Raise a :class:`ConfigError` listing the valid names (with a did-you-mean) unless
    ``name`` is ``auto`` or a registered strategy."""
    from ..core import registry

    if name.lower() == AUTO or name in registry.REGISTRIES["strategy"]:
        return
    if registry.failures():  # perhaps a strategy of a plugin package that failed to load
        raise registry.unknown_name_error(name, "strategy")
    names = strategy_names()
    hint = registry.did_you_mean(name, names, n=2)
    raise ConfigError(
        f"unknown strategy {name!r}.{hint} Strategies: {', '.join(names)} "
        f"(`alchemi-lit plugins --kind strategy` lists them with their packages)"
    )


def create_strategy(
    spec: str | Strategy, plan: Fused | Pipeline, options: dict[str, Any] | None = None
) -> Strategy:
    """A Strategy from a registered name (built with ``options``, its own arguments),
    ``"auto"`` or an instance."""
    from ..core import registry

    options = dict(options or {})
    if isinstance(spec, Strategy):
        if options:
            raise ConfigError(
                f"{', '.join(sorted(options))}: options of the strategy; give them to the "
                f"strategy instance ({type(spec).__name__}({next(iter(sorted(options)))}=...)) "
                f"rather than to the Simulator"
            )
        return spec
    if not isinstance(spec, str):
        raise ConfigError(
            f"strategy must be a registered strategy name ({', '.join(strategy_names())}) or "
            f"a Strategy instance, got {type(spec).__name__}"
        )
    check_strategy_name(spec)
    name = spec
    if name.lower() == AUTO:
        name = "pipeline" if isinstance(plan, Pipeline) else "single"
    entry = registry.get("strategy", name)
    if not (isinstance(entry.cls, type) and issubclass(entry.cls, Strategy)):
        raise ConfigError(
            f"strategy {entry.name!r} ({entry.import_path}, package {entry.source!r}) is not a "
            f"subclass of alchemi_lit.strategies.Strategy; its package must fix the registration"
        )
    missing = sorted(getattr(entry.cls, "__abstractmethods__", ()))
    if missing:
        raise ConfigError(
            f"strategy {entry.name!r} ({entry.import_path}, package {entry.source!r}) does not "
            f"implement {', '.join(missing)}; its package must define them"
        )
    accepted = _parameters(entry.cls)
    foreign = sorted(k for k in options if accepted is not None and k not in accepted)
    if foreign:
        raise ConfigError(
            f"{', '.join(foreign)}: not an option of strategy {entry.name!r} (plan {plan!r}); "
            f"these configure the pipeline and replicas strategies across ranks -- remove them, "
            f"or combine stages with '|' for a pipeline"
        )
    try:
        strategy = entry.create(**options)
    except TypeError as exc:
        raise ConfigError(
            f"strategy {entry.name!r} ({entry.import_path}) cannot be built with "
            f"{options or 'no arguments'} ({exc}); register a preset with its arguments or "
            f"pass an instance"
        ) from exc
    strategy.name = entry.name  # the name it was chosen by
    return strategy


def _parameters(cls: type) -> set[str] | None:
    """The keyword arguments ``cls`` takes (None: any, through ``**kwargs``)."""
    import inspect

    params = inspect.signature(cls).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
