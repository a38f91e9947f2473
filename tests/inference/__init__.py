"""tests.inference."""
