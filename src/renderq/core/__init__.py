"""renderq.core."""
