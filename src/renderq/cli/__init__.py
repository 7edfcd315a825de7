"""renderq.cli."""
