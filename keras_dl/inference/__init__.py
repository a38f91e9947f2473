"""Score a table with a registered model on Spark and write the predictions as a Delta table.

The embedded-transform pattern: the model travels to the executors once (``addFile``), each
Python worker loads it once (a per-process cache) and scores Arrow batches of at most
``batch_size`` rows in a ``mapInPandas`` UDF, so memory stays bounded whatever the table's size.

The package's modules, each with one job (lowest first):

- :mod:`~keras_dl.inference.plan`: the model's signature matched to the DataFrame's columns,
  and the output schema;
- :mod:`~keras_dl.inference.executor`: the UDF body and the per-process model cache;
- :mod:`~keras_dl.inference.driver`: :func:`predict`, which resolves the model, plans, ships
  the model and maps the UDF over the rows;
- :mod:`~keras_dl.inference.cli`: the ``keras-dl predict`` command.

Example::

    keras-dl predict --model models:/digits@champion --table data/digits --out data/scores
"""

from keras_dl.inference.cli import add_arguments, run
from keras_dl.inference.driver import predict, quoted
from keras_dl.inference.executor import load_scorer, score_batches
from keras_dl.inference.plan import ScoringPlan, make_plan

__all__ = [
    "ScoringPlan",
    "add_arguments",
    "load_scorer",
    "make_plan",
    "predict",
    "quoted",
    "run",
    "score_batches",
]
