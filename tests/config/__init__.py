"""tests.config."""
