"""tests.runlock."""
