"""The io layer: results, their stores and serialised batches."""
