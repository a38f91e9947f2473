"""tests.report."""
