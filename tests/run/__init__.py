"""Tests of renderq run: executor, scorer, store, dataset, engine and CLI."""
