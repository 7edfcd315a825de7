"""renderq.models."""
