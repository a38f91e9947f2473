"""Batch inference on a real local Spark: the same numbers as the in-process model, clear errors
for rows that do not match the signature, and the ``keras-dl predict`` command end to end."""

import mlflow
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from deltalake import write_deltalake
from sklearn.datasets import load_digits

from keras_dl.data import open_table, read_table
from keras_dl.errors import DataError
from keras_dl.inference import predict
from keras_dl.model.registry import promote
from tests.conftest import cli_in_process, run_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def champion(digits_model):
    uri, result = digits_model
    promote("digits", result.registered_version, "champion", tracking_uri=uri)
    return uri, result


@pytest.mark.connect_too
def test_spark_scores_equal_in_process_predict(spark, champion):
    uri, result = champion
    digits = load_digits()
    rows = 300
    frame = pd.DataFrame(
        {"id": np.arange(rows), "pixels": list(digits.data[:rows].astype(np.float32))}
    )
    df = spark.createDataFrame(frame).repartition(3)  # several partitions, several workers
    scored = predict(df, "models:/digits@champion", keys=["id"], batch_size=64, tracking_uri=uri)
    out = scored.toPandas().sort_values("id").reset_index(drop=True)
    assert list(out.columns) == ["id", "prediction"] + [f"probability_{i}" for i in range(10)]
    expected = result.model.predict(digits.data[:rows], verbose=0)
    probs = out[[f"probability_{i}" for i in range(10)]].to_numpy()
    np.testing.assert_allclose(probs, expected, atol=1e-5)
    np.testing.assert_array_equal(out["prediction"], expected.argmax(1))


def test_rows_that_do_not_match_the_signature(spark, champion):
    uri, _ = champion
    df = spark.createDataFrame(pd.DataFrame({"id": [1, 2], "image": [[0.0] * 64, [1.0] * 64]}))
    with pytest.raises(DataError) as err:
        predict(df, "models:/digits@champion", tracking_uri=uri)
    text = str(err.value)
    assert "missing pixels" in text and "Expected columns: pixels (float64[64])" in text
    assert "Found columns: id (bigint), image (array<double>)" in text
    scalar = spark.createDataFrame(pd.DataFrame({"pixels": [1.0, 2.0]}))
    with pytest.raises(DataError, match="wrong shape: pixels"):
        predict(scalar, "models:/digits@champion", tracking_uri=uri)


@pytest.mark.connect_too
def test_spark_scoring_refuses_a_nan_pixel_naming_the_column(spark, champion):
    uri, _ = champion
    pixels = load_digits().data[:4].astype(np.float64)
    pixels[2, 9] = np.nan
    df = spark.createDataFrame(pd.DataFrame({"id": np.arange(4), "pixels": list(pixels)}))
    scored = predict(df, "models:/digits@champion", keys=["id"], tracking_uri=uri)
    with pytest.raises(Exception, match=r"Column 'pixels' has a missing value \(null or NaN\)"):
        scored.toPandas()


def test_spark_udf_takes_the_pixels_as_one_array_column(spark, champion):
    """The README's spark_udf form for a tensor-signature model: the 64 pixels as one array
    column (64 scalar columns fail MLflow's tensor check), and a NaN pixel refused there too."""
    uri, result = champion
    mlflow.set_tracking_uri(uri)
    digits = load_digits()
    udf = mlflow.pyfunc.spark_udf(
        spark, "models:/digits@champion", result_type="array<double>", env_manager="local"
    )
    df = spark.createDataFrame(pd.DataFrame({"pixels": list(digits.data[:50])}))
    out = np.stack(df.select(udf("pixels").alias("p")).toPandas()["p"].to_numpy())
    np.testing.assert_allclose(out, result.model.predict(digits.data[:50], verbose=0), atol=1e-5)
    holes = digits.data[:3].copy()
    holes[1, 0] = np.nan
    df = spark.createDataFrame(pd.DataFrame({"pixels": list(holes)}))
    with pytest.raises(Exception, match=r"Column 'pixels' has a missing value"):
        df.select(udf("pixels").alias("p")).toPandas()


# Classic only (no connect_too): each case trains a tabular model, and the labels' names are
# decoded in the scoring UDF the same way on both kinds (Connect's scoring runs in the tests
# marked connect_too).
@pytest.mark.parametrize(
    "classes", [("cat", "dog"), (False, True)], ids=["string label", "bool label"]
)
def test_table_model_with_named_classes(spark, tmp_path, mlflow_uri, classes):
    from keras_dl.config import resolve
    from keras_dl.recipe import load_recipe
    from keras_dl.train import fit

    rng = np.random.default_rng(1)
    n = 400
    x = rng.normal(size=n)
    color = rng.choice(["red", "blue"], n)
    frame = pd.DataFrame(
        {"x": x, "color": color, "kind": np.where((x > 0) ^ (color == "red"), *classes)}
    )
    table = str(tmp_path / "pets")
    write_deltalake(table, pa.Table.from_pandas(frame, preserve_index=False))
    recipe = load_recipe("tabular")
    exp = resolve(
        recipe.defaults,
        sets=[
            f"data.table={table}",
            "data.label=kind",
            f"tracking.uri={mlflow_uri}",
            f"runtime.run_dir={tmp_path / 'run'}",
            "train.epochs=2",
            "train.verbose=0",
        ],
    )
    fit(exp, recipe)
    rows = frame.assign(id=np.arange(n))
    scored = predict(spark.createDataFrame(rows), "models:/tabular/1", keys=["id", "kind"])
    out = scored.toPandas().sort_values("id").reset_index(drop=True)
    probs = [f"probability_{c}" for c in sorted(classes)]
    assert list(out.columns) == ["id", "kind", "prediction", *probs]
    model = mlflow.pyfunc.load_model("models:/tabular/1")
    expected = np.asarray(model.predict(frame[["x", "color"]]))
    np.testing.assert_allclose(out[probs], expected, atol=1e-5)
    np.testing.assert_array_equal(out["prediction"], np.array(sorted(classes))[expected.argmax(1)])
    # A key that is also a model input is copied through and fed to the model, once each.
    keyed = predict(spark.createDataFrame(rows), "models:/tabular/1", keys=["id", "x"])
    keyed = keyed.toPandas().sort_values("id").reset_index(drop=True)
    assert list(keyed.columns) == ["id", "x", "prediction", *probs]
    np.testing.assert_allclose(keyed["x"], frame["x"])
    np.testing.assert_allclose(keyed[probs], expected, atol=1e-5)
    # The README's spark_udf form for a column signature: the named feature columns.
    udf = mlflow.pyfunc.spark_udf(
        spark, "models:/tabular/1", result_type="array<double>", env_manager="local"
    )
    udf_out = spark.createDataFrame(rows).select("id", udf("x", "color").alias("p")).toPandas()
    udf_probs = np.stack(udf_out.sort_values("id")["p"].to_numpy())
    np.testing.assert_allclose(udf_probs, expected, atol=1e-5)


def test_predict_command_writes_a_delta_table(champion, digits_table, tmp_path):
    uri, result = champion
    out = str(tmp_path / "scores")
    # One core: one Spark Python worker imports TensorFlow and scores the tasks in turn (on
    # local[2] three workers imported it for the 3 tasks of 1,797 rows, ~5 CPU-s each). Scoring
    # on several workers is test_spark_scores_equal_in_process_predict's.
    proc = run_cli(
        "predict",
        "--model",
        "models:/digits@champion",
        "--table",
        digits_table,
        "--version",
        "0",
        "--out",
        out,
        "--master",
        "local[1]",
        "--tracking-uri",
        uri,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"scored 1797 rows of {digits_table} (version 0)" in proc.stdout
    scores = read_table(out).to_pandas()
    assert len(scores) == 1797
    assert {"label", "split", "prediction", "probability_9"} <= set(scores.columns)
    assert (scores["prediction"] == scores["label"]).mean() >= 0.8
    again = cli_in_process(
        "predict", "--model", "models:/digits@champion", "--table", digits_table, "--out", out,
        "--tracking-uri", uri, cwd=tmp_path,
    )  # fmt: skip
    assert again.returncode == 2 and "already exists" in again.stderr
    # Appending: the report counts the rows this command wrote, not the table's.
    more = run_cli(
        "predict", "--model", "models:/digits@champion", "--table", digits_table, "--version",
        "0", "--out", out, "--mode", "append", "--master", "local[1]", "--tracking-uri", uri,
        cwd=tmp_path,
    )  # fmt: skip
    assert more.returncode == 0, more.stderr[-3000:]
    assert "scored 1797 rows" in more.stdout and "version 1" in more.stdout
    assert read_table(out).num_rows == 2 * 1797
    zero = cli_in_process(
        "predict", "--model", "models:/digits@champion", "--table", digits_table, "--out",
        str(tmp_path / "other"), "--batch-size", "0", "--tracking-uri", uri, cwd=tmp_path,
    )  # fmt: skip
    assert zero.returncode == 2 and "--batch-size: must be an integer >= 1" in zero.stderr


# Classic only: the object store is the same on both; scoring on Connect is above.
def test_scoring_reads_and_writes_object_storage(spark, champion, s3, monkeypatch):
    """A table on S3 scored by Spark tasks that read it and write the output's files to S3
    themselves; the driver commits one Delta version and counts only what it wrote."""
    from keras_dl.data.ingest.datasets import ingest_sklearn_digits
    from keras_dl.inference.tables import read_table_into_spark, write_predictions

    uri, _ = champion
    table, out = s3.uri("digits"), s3.uri("scores")
    ingest_sklearn_digits(table, rows_per_group=256)
    df, snapshot = read_table_into_spark(spark, table)
    scored = predict(df, "models:/digits@champion", features=["pixels"], keys=["label"],
                     tracking_uri=uri)  # fmt: skip
    report = write_predictions(scored, out)
    assert (report.version, report.rows) == (0, 1797) and report.files >= 1
    again = write_predictions(scored, out, mode="append")
    assert (again.version, again.rows) == (1, 1797)
    written = read_table(out)
    assert written.num_rows == 2 * 1797
    assert all(f.startswith(f"s3://{s3.name}/scores/") for f in open_table(out).files)
    # Conditional commits need no lock; a DynamoDB lock (which deltalake 1.x ignores) is refused.
    monkeypatch.setenv("AWS_S3_LOCKING_PROVIDER", "dynamodb")
    with pytest.raises(DataError, match=r"dropped the DynamoDB lock"):
        write_predictions(scored, s3.uri("unsafe"))


def test_scoring_reads_and_writes_azure(spark, champion, azure):
    """The same on Azure (Azurite): Spark tasks get the account's settings with their work, read
    the abfss:// table and write the output's files; the driver commits (conditional writes)."""
    from keras_dl.data.ingest.datasets import ingest_sklearn_digits
    from keras_dl.inference.tables import read_table_into_spark, write_predictions

    uri, _ = champion
    table, out = azure.uri("digits"), azure.uri("scores")
    ingest_sklearn_digits(table, rows_per_group=256)
    df, _ = read_table_into_spark(spark, table)
    scored = predict(df, "models:/digits@champion", features=["pixels"], keys=["label"],
                     tracking_uri=uri)  # fmt: skip
    report = write_predictions(scored, out)
    assert (report.version, report.rows) == (0, 1797) and report.files >= 1
    assert read_table(out).num_rows == 1797
    assert all(f.startswith(f"{azure.uri('scores')}/") for f in open_table(out).files)


@pytest.mark.connect_only
def test_predict_command_scores_over_spark_connect(
    spark, connect_url, champion, digits_table, tmp_path
):
    """``keras-dl predict --master sc://...``: a Connect client process with no JVM of its own."""
    uri, _ = champion
    out = str(tmp_path / "scores")
    proc = run_cli(
        "predict", "--model", "models:/digits@champion", "--table", digits_table, "--version",
        "0", "--out", out, "--master", connect_url, "--tracking-uri", uri, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "JVM_ATTRIBUTE_NOT_SUPPORTED" not in proc.stderr
    assert f"scored 1797 rows of {digits_table} (version 0)" in proc.stdout
    scores = read_table(out).to_pandas()
    assert (scores["prediction"] == scores["label"]).mean() >= 0.8
