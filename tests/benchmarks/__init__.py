"""tests.benchmarks."""
