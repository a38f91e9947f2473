"""A run's report.html: ``build`` gathers the run's figures, ``page`` draws them."""
