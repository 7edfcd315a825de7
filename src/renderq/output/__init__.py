"""renderq.output."""
