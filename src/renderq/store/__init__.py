"""renderq.store."""
