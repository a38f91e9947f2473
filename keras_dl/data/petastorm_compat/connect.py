"""Petastorm's Spark entry points refuse a Spark Connect session by name.

Petastorm's ``materialize_dataset`` (``spark.sparkContext._jsc``, Hadoop configuration) and its
``make_spark_converter`` (``sparkContext.applicationId``) need the JVM's SparkContext, which a
Spark Connect client (Databricks shared and serverless clusters) does not have: there they fail
deep inside with pyspark's ``JVM_ATTRIBUTE_NOT_SUPPORTED``. Patched, they raise
:class:`~keras_dl.errors.SparkConnectError` first, naming the call and what works instead.
A classic session goes through to Petastorm's own code unchanged.
"""

from __future__ import annotations

import functools

_PATCHED = "_keras_dl_refuses_connect"

_TARGETS = {
    "petastorm.etl.dataset_metadata": (
        "materialize_dataset",
        "Petastorm's materialize_dataset",
        "Write the table with df.write (Delta or Parquet) and train on it with keras_dl "
        "(data.table), or run materialize_dataset from a classic session (a single-user cluster).",
    ),
    "petastorm.spark.spark_dataset_converter": (
        "make_spark_converter",
        "Petastorm's make_spark_converter",
        "Use keras_dl.data.spark_converter.make_spark_converter instead: the same converter API, and it "
        "works on Spark Connect.",
    ),
}


def patch_module(module) -> bool:
    """Wrap ``module``'s Spark entry point (if it is one of the two) to refuse Connect."""
    target = _TARGETS.get(module.__name__)
    if target is None:
        return False
    name, feature, instead = target
    original = getattr(module, name, None)
    if original is None or getattr(original, _PATCHED, False):
        return False

    @functools.wraps(original)
    def refusing(first, *args, **kwargs):
        from keras_dl.connect import is_connect, refuse

        session = getattr(first, "sparkSession", first)  # a DataFrame, or the session itself
        if is_connect(session):
            raise refuse(feature, instead)
        return original(first, *args, **kwargs)

    setattr(refusing, _PATCHED, True)
    setattr(module, name, refusing)
    return True
