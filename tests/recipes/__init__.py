"""tests.recipes."""
