"""renderq.engine."""
