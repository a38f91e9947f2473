"""tests.data.ingest."""
