"""Table formats, each turned into a :class:`~keras_dl.data.snapshot.TableSnapshot`.

Only the modules here know a table format: ``delta`` (the Delta log), ``parquet`` (files,
folders, globs) and ``petastorm_meta`` (a Petastorm dataset's Unischema, read without running
code).
"""
