"""keras_dl.connect on both kinds of session (connect_too: the suite's ``spark`` fixture runs
each test on a classic and on a Spark Connect session): the same counts, and files found on the
executors."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pandas as pd
import pytest

from keras_dl.connect import (
    default_parallelism,
    partition_count,
    ship_file,
    ship_folder,
)


@pytest.mark.connect_too
def test_parallelism_and_partitions_are_counted_without_sparkcontext_or_rdd(spark):
    assert default_parallelism(spark) == 2  # local[2]
    assert partition_count(spark.range(100).repartition(3)) == 3


@pytest.mark.connect_too
def test_a_shipped_file_and_folder_are_found_on_the_executors(spark, tmp_path):
    tag = uuid.uuid4().hex[:8]
    file = tmp_path / f"weights-{tag}.txt"
    file.write_text("a file")
    folder = tmp_path / f"model-{tag}"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "model.txt").write_text("a folder")
    file_name, folder_name = ship_file(spark, str(file)), ship_folder(spark, str(folder))

    def read(batches):  # on the executors
        from pyspark import SparkFiles

        for _ in batches:
            with (
                open(SparkFiles.get(file_name)) as f,
                open(os.path.join(SparkFiles.get(folder_name), "data", "model.txt")) as g,
            ):
                yield pd.DataFrame({"file": [f.read()], "folder": [g.read()]})

    out = spark.range(4).repartition(2).mapInPandas(read, "file string, folder string").toPandas()
    assert len(out) == 2
    assert set(out["file"]) == {"a file"} and set(out["folder"]) == {"a folder"}


@pytest.mark.connect_only
def test_petastorms_own_spark_calls_refuse_connect_by_name(spark, tmp_path):
    """A Connect-only user of Petastorm's API gets keras_dl's error, not JVM_ATTRIBUTE_NOT_SUPPORTED."""
    from petastorm.codecs import ScalarCodec
    from petastorm.etl.dataset_metadata import materialize_dataset
    from petastorm.spark import make_spark_converter
    from petastorm.unischema import Unischema, UnischemaField
    from pyspark.sql.types import IntegerType

    from keras_dl.errors import SparkConnectError

    schema = Unischema("s", [UnischemaField("x", np.int32, (), ScalarCodec(IntegerType()), False)])
    refused = pytest.raises(SparkConnectError, match="Petastorm's materialize_dataset is not avail")
    with refused, materialize_dataset(spark, f"file://{tmp_path}/ds", schema):
        pass
    with pytest.raises(
        SparkConnectError, match="keras_dl.data.spark_converter.make_spark_converter"
    ):
        make_spark_converter(spark.range(3))
