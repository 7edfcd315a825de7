"""Test and bench helpers that ship with the package (tiny seeded checkpoints)."""
