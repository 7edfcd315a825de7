"""Benchmarks and profiling: what renderq measures on the user's own stack."""
