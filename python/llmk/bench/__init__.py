"""Benchmark harness: ``python -m llmk.bench --op rmsnorm [--csv F] [--plot F]``."""
