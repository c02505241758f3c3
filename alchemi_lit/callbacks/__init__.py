"""Callbacks bound to the step stages of HookStageEnum."""

from ..hooks import Callback, HookStageEnum, LambdaCallback, StepContext
from .nan_guard import NaNGuard

__all__ = ["Callback", "HookStageEnum", "LambdaCallback", "NaNGuard", "StepContext"]
