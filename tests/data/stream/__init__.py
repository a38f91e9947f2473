"""tests.data.stream."""
