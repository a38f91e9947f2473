"""tests.data.petastorm_compat."""
