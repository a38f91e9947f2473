"""Benchmarks users can run too: `keras-dl bench NAME` (each figure printed beside its baseline)."""
