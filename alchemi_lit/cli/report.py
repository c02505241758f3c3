"""``alchemi-lit report STORE [--plots DIR] [--trajectory TRAJ]``: summarize a results store
(or a property workflow's output folder: :mod:`.workflow_report`, or the store of the MD
observables: :func:`alchemi_lit.report.observables.report_observables`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .command import Command, console_width

if TYPE_CHECKING:
    from .app import CLI


class ReportCommand(Command):
    """The table :func:`alchemi_lit.report.report` prints, and its plots."""

    help = "summarize a results store and (with --plots) plot it"

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "store",
            type=str,
            help="results store written by ZarrSink (.zarr), the store of the MD observables "
            "(RDF, MSD, VACF, BlockAverages: their path=), or a property workflow's "
            "output folder (alchemi-lit eos / elastic / phonons / vibrations / qha)",
        )
        parser.add_argument(
            "--plots",
            type=str | None,
            default=None,
            help="directory for PNG plots (needs matplotlib)",
        )
        parser.add_argument(
            "--trajectory",
            type=str | None,
            default=None,
            help="TrajectoryWriter store to plot T / energy traces from",
        )

    def execute(self, cli: CLI, cfg: Any) -> int:
        from rich.console import Console

        from ..report import report
        from ..report.observables import is_observables_store, report_observables
        from .workflow_report import report_workflow, workflow_name

        if workflow_name(cfg.store) is not None:  # E(V) fits, C_ij, phonon bands and DOS
            report_workflow(cfg.store, cfg.plots, console=Console(width=console_width()))
            return 0
        if is_observables_store(cfg.store):  # RDF, MSD, VACF and block averages
            report_observables(cfg.store, cfg.plots, console=Console(width=console_width()))
            return 0
        report(cfg.store, cfg.plots, cfg.trajectory, console=Console(width=console_width()))
        return 0
