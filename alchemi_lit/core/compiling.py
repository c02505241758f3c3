"""``torch.compile`` with an eager fallback, for ``Simulator(compile=True)``.

Why a wrapper: compilation happens at the first call, deep inside a run, and can fail
there for reasons the user cannot act on mid-run (no C compiler, an operator the
backend lacks, too many recompilations).  A run should not die for an optimisation:
the first failure is logged once as a warning naming what was being compiled, and
that function runs eagerly from then on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .errors import first_line


def compile_or_eager(
    fn: Callable[..., Any],
    what: str,
    on_fallback: Callable[[], None] | None = None,
    **options: Any,
) -> Callable[..., Any]:
    """``fn`` compiled lazily by ``torch.compile(fn, **options)``; on the first compiler
    error, a warning naming ``what``, ``on_fallback()`` and eager calls from then on."""
    compiled = torch.compile(fn, **options)
    failed = False

    def run(*args: Any, **kwargs: Any) -> Any:
        nonlocal failed
        if failed:
            return fn(*args, **kwargs)
        try:
            return compiled(*args, **kwargs)
        except Exception as exc:  # no compiler, unsupported op, recompilation limit
            from loguru import logger

            failed = True
            logger.warning(
                f"torch.compile failed for {what} ({type(exc).__name__}: {first_line(exc)}); "
                f"running eagerly from now on"
            )
            if on_fallback is not None:
                on_fallback()
            return fn(*args, **kwargs)

    return run


__all__ = ["compile_or_eager"]
