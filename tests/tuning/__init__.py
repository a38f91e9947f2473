"""tests.tuning."""
