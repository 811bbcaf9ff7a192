"""Pipelines: train-or-load of each profile's models, the long resumable Sudoku run, and sharded resumable MI labels
(alone or on the ranks of a `torchrun` job)."""
