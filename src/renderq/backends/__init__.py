"""Executors, scorers and the torch helpers behind them; the model registry."""
