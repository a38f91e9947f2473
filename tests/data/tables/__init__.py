"""tests.data.tables."""
