"""Data sets and generators."""
