"""``alchemi-lit``: run, validate and inspect simulations from YAML configs.

Commands::

    alchemi-lit run --config configs/quickstart.yaml
    alchemi-lit run --config x.yaml --simulator.stages.1.init_args.temperature 500
    alchemi-lit run --config x.yaml --print_config          # resolved config, re-runnable
    alchemi-lit validate --config x.yaml                     # build and check all, run nothing
    alchemi-lit run --simulator.model.help LennardJones      # parameters of one class
    alchemi-lit plugins [--kind integrator]                  # every registered plugin
    alchemi-lit report results.zarr [--plots DIR] [--trajectory traj.zarr]

A config has three sections, as in LightningCLI::

    simulator:   # the arguments of alchemi_lit.Simulator; plugins as class_path/init_args
      model: {class_path: lj-argon}
      stages:                       # a list is a fused plan: FIRE + Langevin
        - {class_path: FIRE, init_args: {fmax: 0.05}}
        - {class_path: Langevin, init_args: {temperature: 60, steps: 200}}
      sinks: [{class_path: ZarrSink, init_args: {store: results/x.zarr, mode: w}}]
    data:        # what to run
      structures: builtin:argon     # or any file ASE reads (relative to the config file)
      builtin_args: {n_systems: 32}
      sampler: {max_atoms: 20000}   # optional: inflight batching within these budgets
    output:      # optional: where <name>.config.yaml and <name>.summary.json go
      dir: results

How a run / validate command line becomes a run (one module each):

1. :mod:`.argv` splits it: config files, ``--key value`` overrides, ``--resume``,
   ``--KEY.help``, and what jsonargparse takes as is (help, ``--print_config``).
2. :mod:`.config` merges the YAML files and applies the overrides to one plain dict
   (list items by index, presets: what jsonargparse does not parse, see there).
3. :mod:`.checks` resolves registered plugin names (:mod:`.names`) and type-checks each
   plugin's ``init_args`` against its own signature, so an error names the exact key.
4. jsonargparse parses the result (types, defaults, ``--print_config``, help); the
   resolved config is its dump; :meth:`CLI.before_instantiate` may change it.
5. :mod:`.build` instantiates the objects one by one (:meth:`CLI.build_simulator`), so a
   constructor's ``ValueError`` is reported under the key of the object that raised it.

:class:`CLI` (in :mod:`.app`) holds the commands (:mod:`.run`, :mod:`.plugins`,
:mod:`.report`) and the hooks a subclass overrides.  Errors: :mod:`.errors`.
"""

from __future__ import annotations

from .app import CLI, main
from .command import Command
from .errors import EXIT_USAGE, CLIError

__all__ = ["CLI", "EXIT_USAGE", "CLIError", "Command", "main"]
