"""renderq.executors."""
