"""The core layer: the batch and what it is made of (no imports above)."""
