"""The engine: what runs a plan, below the strategies (checkpoints, resume checks,
interrupts; the step loop moves here as the architecture issue lands)."""
