"""renderq.scoring."""
