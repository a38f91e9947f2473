"""tests.model."""
