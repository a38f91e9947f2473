"""Write the notebooks in this folder (``python notebooks/make_notebooks.py``).

The notebooks only call keras_dl; this script keeps their source reviewable as plain Python.
Each reads its settings from ``KERAS_DL_NB_*`` environment variables, so the test suite runs
them with small settings (tests/test_notebooks.py).
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

PARAMETERS = """\
# Parameters (the test suite sets these through the environment, with small values).
import os

WORKDIR = os.path.abspath(os.environ.get("KERAS_DL_NB_WORKDIR", "nb_work"))
EPOCHS = int(os.environ.get("KERAS_DL_NB_EPOCHS", "10"))
WORKERS = int(os.environ.get("KERAS_DL_NB_WORKERS", "2"))
SPARK_MASTER = os.environ.get("KERAS_DL_NB_SPARK_MASTER", "local[2]")  # 03 and 04
os.makedirs(WORKDIR, exist_ok=True)
TABLE = f"{WORKDIR}/digits"
TRACKING_URI = f"sqlite:///{WORKDIR}/mlflow.db"
os.environ["MLFLOW_TRACKING_URI"] = TRACKING_URI"""

INGEST = """\
from keras_dl.data.ingest.datasets import ingest_sklearn_digits

# "ignore" keeps an existing table as it is, so re-running the notebook reads the same version.
print(ingest_sklearn_digits(TABLE, mode="ignore", rows_per_group=128))"""


def explore() -> nbformat.NotebookNode:
    return _notebook(
        md(
            "# 01 Explore the data\n\nIngest a dataset into a Delta table, read its schema, look at "
            "a few images, and check the table against the workers you plan to train on (each "
            "worker reads its own run of rows, every row once per epoch; workers that share a "
            "row group each decode it whole, so the report says when smaller groups would help)."
        ),
        PARAMETERS,
        md(
            "## Ingest to Delta\n\nscikit-learn's 8x8 digits ship with it, so this works offline. "
            "For the flowers photos: `keras-dl ingest tfds tf_flowers --to data/flowers`."
        ),
        INGEST,
        md("## Schema, version and files"),
        """\
from keras_dl.data.tables import open_table

snapshot = open_table(TABLE)
print(snapshot.schema)
print("version", snapshot.version, "| partitioned by", snapshot.partition_columns,
      "|", len(snapshot.files), "files")""",
        md("## Sample images"),
        """\
import matplotlib.pyplot as plt
import numpy as np

from keras_dl.data import read_table

# The rows training would see (deleted rows gone, typed columns), as a pyarrow.Table.
sample = read_table(TABLE, columns=["pixels", "label", "split"], limit=8).to_pandas()
fig, axes = plt.subplots(1, len(sample), figsize=(2 * len(sample), 2.4))
for ax, (_, row) in zip(axes, sample.iterrows()):
    ax.imshow(np.asarray(row["pixels"]).reshape(8, 8), cmap="gray_r")
    ax.set_title(f"{row['label']} ({row['split']})")
    ax.axis("off")
plt.show()
sample[["label", "split"]]""",
        md("## Row groups and partitions against the planned workers"),
        """\
from keras_dl.explore import describe_table

report = describe_table(TABLE, workers=WORKERS, split_column="split")
print(report)
assert report.ok, report.problems""",
        md(
            "The same table on 16 workers is still exact, but workers share row groups: the "
            "notes say how to rewrite it. More workers than rows is refused."
        ),
        """\
shared = describe_table(TABLE, workers=16, split_column="split")
print(shared)
assert shared.ok and shared.notes
too_many = describe_table(TABLE, workers=5000, split_column="split")
print(too_many)
assert not too_many.ok""",
    )


def build_modules() -> nbformat.NotebookNode:
    return _notebook(
        md(
            "# 02 Build the modules\n\nThe pieces `keras_dl.train.fit` puts together, each on its "
            "own: a recipe's model, the data module, the callbacks; then a short `model.fit` of "
            "your own with them."
        ),
        PARAMETERS,
        INGEST,
        md("## The recipe and its resolved config"),
        """\
from keras_dl.config import resolve
from keras_dl.recipe import load_recipe

recipe = load_recipe("digits")
exp = resolve(recipe.defaults, sets=[f"data.table={TABLE}", f"train.epochs={EPOCHS}"])
print(recipe.description)
print(exp.train)
print(exp.model)""",
        md("## The data module: one table version, a column plan, one tf.data pipeline per split"),
        """\
from keras_dl.data.splits import make_splits

data = make_splits(exp.data, exp.train.batch_size, accept=recipe.accept,
                   preprocess=recipe.preprocess, preprocess_train=recipe.preprocess_train)
print(data.plan)
print("train:", data.train.stats, "steps/epoch", data.train.steps)
print("validation:", data.validation.stats)
features, labels = next(iter(data.train.dataset.take(1)))
print("one batch:", features.shape, features.dtype, labels.shape, labels.dtype)""",
        md("## The model"),
        """\
model = recipe.build_model(data, exp)
model.summary()""",
        md("## The callbacks, each usable in any `model.fit`"),
        """\
from keras_dl.callbacks import EarlyStopping, Throughput

throughput = Throughput(batch_size=exp.train.batch_size)
early = EarlyStopping(monitor="val_loss", patience=3, restore_best_weights=True)
print(throughput, early, sep="\\n")""",
        md("## A short fit"),
        """\
from keras_dl.train import make_optimizer

model.compile(optimizer=make_optimizer(exp.train.optimizer, exp.train.learning_rate),
              loss=recipe.loss, metrics=list(recipe.metrics))
history = model.fit(
    throughput.instrument(data.train.dataset),
    steps_per_epoch=data.train.steps,
    validation_data=data.validation.dataset,
    validation_steps=data.validation.steps,
    epochs=EPOCHS,
    callbacks=[throughput, early],
    verbose=2,
)
print("speed of the last epoch:", throughput.epoch_stats)
scores = model.evaluate(data.test.dataset, steps=data.test.steps, return_dict=True, verbose=0)
print("test:", scores)
assert scores["accuracy"] > 0.5""",
    )


def train_and_scale() -> nbformat.NotebookNode:
    return _notebook(
        md(
            "# 03 Train and scale\n\nThe same recipe on one device, on `MirroredStrategy` (two "
            "logical CPUs here; the GPUs of a node elsewhere) and on Horovod with `np=-2` (two "
            "processes on this host, the way Databricks' `HorovodRunner(np=-2)` runs). Then find "
            "the runs in MLflow, promote the best, and score a DataFrame with it on Spark."
        ),
        PARAMETERS
        + """
HOROVOD = os.environ.get("KERAS_DL_NB_HOROVOD", "1") == "1"

# Two logical CPUs for MirroredStrategy: this must run before TensorFlow starts.
from keras_dl.distribute.strategy import use_logical_cpus

use_logical_cpus(2)""",
        INGEST,
        md("## Three ways to train the same recipe"),
        """\
import time

from keras_dl.config import resolve
from keras_dl.recipe import load_recipe
from keras_dl.train import fit

recipe = load_recipe("digits")


def experiment(strategy, *sets):
    return resolve(recipe.defaults, sets=[
        f"data.table={TABLE}", f"train.epochs={EPOCHS}", "train.verbose=0",
        f"tracking.uri={TRACKING_URI}", f"runtime.strategy={strategy}",
        f"runtime.run_dir={WORKDIR}/runs/{strategy}", *sets])


results = {}
start = time.perf_counter()
results["one device"] = (fit(experiment("none"), recipe), time.perf_counter() - start)
start = time.perf_counter()
results["MirroredStrategy (2)"] = (fit(experiment("mirrored"), recipe), time.perf_counter() - start)""",
        md(
            "Horovod: `launch` runs `fit` on every rank through `HorovodRunner(np=-2)`; rank 0 "
            "logs and registers."
        ),
        """\
if HOROVOD:
    from keras_dl.launch import launch

    start = time.perf_counter()
    results["Horovod np=-2"] = (launch(experiment("horovod", "runtime.np=-2")),
                                time.perf_counter() - start)""",
        md("## Time and validation loss"),
        """\
import matplotlib.pyplot as plt
import pandas as pd

table = pd.DataFrame(
    [{"setup": name, "seconds": round(seconds, 1), "val_loss": r.history["val_loss"][-1],
      "test_accuracy": r.metrics.get("test_accuracy"), "run_id": r.run_id}
     for name, (r, seconds) in results.items()]
).set_index("setup")
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3))
table["seconds"].plot.barh(ax=left, title="wall time (s)")
table["val_loss"].plot.barh(ax=right, title="final val_loss")
plt.tight_layout()
plt.show()
table""",
        md("## Find the runs in MLflow, promote the best"),
        """\
import mlflow

from keras_dl.model.registry import promote

runs = mlflow.search_runs(experiment_names=["digits"], order_by=["metrics.val_loss ASC"])
runs[["run_id", "params.runtime.strategy", "metrics.val_loss", "metrics.test_accuracy"]]""",
        """\
best = runs.iloc[0]["run_id"]
(version,) = mlflow.MlflowClient().search_model_versions(f"run_id='{best}'")
lineage = promote("digits", int(version.version), alias="champion", tracking_uri=TRACKING_URI)
print(lineage)""",
        md("## Score a DataFrame on Spark with the champion"),
        """\
from pyspark.sql import functions as F

from keras_dl.inference import predict
from keras_dl.inference.tables import read_table_into_spark, spark_session

spark = spark_session(SPARK_MASTER)
try:
    df, snapshot = read_table_into_spark(spark, TABLE)
    scored = predict(df, "models:/digits@champion", tracking_uri=TRACKING_URI)
    accuracy = scored.groupBy("split").agg(
        F.count("*").alias("rows"),
        F.avg((F.col("prediction") == F.col("label")).cast("double")).alias("accuracy"),
    ).toPandas()
finally:
    spark.stop()
accuracy""",
    )


def spark_ml_pipeline() -> nbformat.NotebookNode:
    return _notebook(
        md(
            "# 04 A Spark ML Pipeline with a Keras model\n\n`keras_dl.spark.KerasEstimator` is a "
            "Spark ML Estimator (Params named as in Horovod's `KerasEstimator`): a "
            "`VectorAssembler` and a `StandardScaler` feed it, `fit` trains through keras_dl's "
            "one training path (a Delta table under `store`, checkpoints, one MLflow run), and "
            "the `KerasModel` it returns scores on the executors with Spark ML's `prediction` "
            "and `probability` columns. Then an evaluator, a save and load, what `store` keeps, "
            "and tuning."
        ),
        PARAMETERS,
        """\
from keras_dl.inference.tables import spark_session

spark = spark_session(SPARK_MASTER, app_name="keras-dl-notebook-04")""",
        md("## Iris as a Spark DataFrame"),
        """\
import pandas as pd
from sklearn.datasets import load_iris

iris = load_iris()
frame = pd.DataFrame(iris.data, columns=["sepal_length", "sepal_width", "petal_length", "petal_width"])
frame["label"] = iris.target.astype(float)  # a class index, as StringIndexer makes it
train, test = spark.createDataFrame(frame).randomSplit([0.8, 0.2], seed=7)
print(train.count(), "training rows,", test.count(), "test rows")""",
        md("## Assembler -> scaler -> KerasEstimator"),
        """\
import keras
from pyspark.ml import Pipeline
from pyspark.ml.feature import StandardScaler, VectorAssembler

from keras_dl.spark import KerasEstimator

keras.utils.set_random_seed(0)
model = keras.Sequential([
    keras.Input((4,)),
    keras.layers.Dense(16, activation="relu"),
    keras.layers.Dense(3, activation="softmax"),
])
estimator = KerasEstimator(
    model=model,
    optimizer=keras.optimizers.Adam(0.02),
    loss="sparse_categorical_crossentropy",
    metrics=["accuracy"],
    feature_cols=["scaled"],
    label_cols=["label"],
    validation=0.2,
    batch_size=16,
    epochs=4 * EPOCHS,
    store=f"{WORKDIR}/store",
    registered_model="iris",
    experiment=["callbacks.plots=false"],
)
pipeline = Pipeline(stages=[
    VectorAssembler(inputCols=list(frame.columns[:4]), outputCol="features"),
    StandardScaler(inputCol="features", outputCol="scaled"),
    estimator,
])
fitted = pipeline.fit(train)
print("MLflow run:", fitted.stages[-1].getRunId())""",
        md("## Score and evaluate"),
        """\
from pyspark.ml.evaluation import MulticlassClassificationEvaluator

scored = fitted.transform(test)
scored.select("label", "prediction", "probability").show(5, truncate=False)
accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(scored)
print(f"test accuracy: {accuracy:.3f}")""",
        md("## Save and load the whole pipeline"),
        """\
import numpy as np
from pyspark.ml import PipelineModel

fitted.write().overwrite().save(f"{WORKDIR}/iris_pipeline")
loaded = PipelineModel.load(f"{WORKDIR}/iris_pipeline")
again = loaded.transform(test)
same = np.array_equal(
    np.array(scored.select("prediction").toPandas()["prediction"]),
    np.array(again.select("prediction").toPandas()["prediction"]),
)
print("same predictions after load:", same)""",
        md(
            "## What `store` keeps\n\n`store` holds the rows `fit` trained on, as a Delta table "
            "named after their content (`store/data/<fingerprint>`): fitting the same rows again, "
            "in this process or another, reuses it without writing anything. It also holds the "
            "run folders (`store/runs/<id>`: checkpoints and `run.json`). A fit that fails or is "
            "killed leaves its MLflow run id in the error (and in `run.json`): "
            "`estimator.setRunId(run_id)` and `fit` again, here or in a new Python process, "
            "continues that same MLflow run from its last checkpoint. `store` may be "
            "`s3://bucket/prefix`: the data and the run folders both go there, so the run "
            "resumes from any machine that reaches the store."
        ),
        md(
            "## Tuning\n\nA `TrainValidationSplit` over the whole pipeline, with a grid over the "
            "estimator's Params, inside one MLflow run: each trial, and the refit of the best, is "
            "a child run of it. (Without a run around the tuner, each trial is a top-level run "
            "of its own.)"
        ),
        """\
import mlflow
from pyspark.ml.tuning import ParamGridBuilder, TrainValidationSplit

grid = ParamGridBuilder().addGrid(estimator.batch_size, [8, 32]).build()
tuner = TrainValidationSplit(
    estimator=pipeline, estimatorParamMaps=grid, trainRatio=0.75, seed=1,
    evaluator=MulticlassClassificationEvaluator(metricName="accuracy"),
)
with mlflow.start_run(run_name="tune-iris") as parent:
    tuned = tuner.fit(train)
print("validation accuracy per batch size:", dict(zip([8, 32], np.round(tuned.validationMetrics, 3))))
children = mlflow.search_runs(filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
print(len(children), "child runs under", parent.info.run_id)""",
        "spark.stop()",
    )


def nightly_loop() -> nbformat.NotebookNode:
    return _notebook(
        md(
            "# 05 The nightly loop\n\nNew rows land in the table every night. Train once and "
            "crown the model `champion`; then, each night, fine-tune the champion on the rows "
            "added since the last version trained on (`data.since_version`, "
            "`model.init_from`), compare it with the champion on the same rows "
            "(`registry.must_beat`), and move the alias only when it earned it "
            "(`registry.set_alias`). The CLI form of each step is in the README."
        ),
        PARAMETERS,
        """\
import shutil

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

LOOP_TABLE = f"{WORKDIR}/nightly"
shutil.rmtree(LOOP_TABLE, ignore_errors=True)  # every run of the notebook starts at v0


def night_rows(n_train, seed):
    \"\"\"A night's rows: y = 2 x1 - x2 + noise, with validation and test rows.\"\"\"
    rng = np.random.default_rng(seed)
    n = n_train + 2 * (n_train // 5)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    split = ["train"] * n_train + ["validation", "test"] * (n_train // 5)
    return pa.table({"x1": x1, "x2": x2, "y": 2 * x1 - x2 + 0.05 * rng.normal(size=n),
                     "split": split})""",
        md("## Night 0: train on v0 and crown it"),
        """\
import mlflow

from keras_dl.config import resolve
from keras_dl.recipe import load_recipe
from keras_dl.train import fit

recipe = load_recipe("tabular")
client = mlflow.MlflowClient(TRACKING_URI)


def night(run, *sets):
    exp = resolve(recipe.defaults, sets=[
        f"data.table={LOOP_TABLE}", "data.label=y", "data.features=x1,x2",
        "data.split_column=split", "train.batch_size=32", "train.verbose=0",
        "callbacks.plots=false", f"tracking.uri={TRACKING_URI}",
        "tracking.registered_model=nightly", f"runtime.run_dir={WORKDIR}/runs/nightly-{run}",
        "registry.must_beat=champion", "registry.set_alias=champion", *sets])
    return fit(exp, recipe)


write_deltalake(LOOP_TABLE, night_rows(300, seed=0))
first = night("v0", "train.epochs=2")
print("registered version", first.registered_version, "| test_rmse", first.metrics["test_rmse"])
print("champion -> version", client.get_model_version_by_alias("nightly", "champion").version)""",
        md("## New rows land: v1"),
        """\
trained_on = DeltaTable(LOOP_TABLE).version()
write_deltalake(LOOP_TABLE, night_rows(160, seed=1), mode="append")
print(f"table at version {DeltaTable(LOOP_TABLE).version()}, last trained on {trained_on}")""",
        md(
            "## Night 1: fine-tune the champion on (v0, v1]\n\nOnly the appended rows are read; "
            "the run records the model it started from and the version range it trained on."
        ),
        """\
second = night("v1", f"data.since_version={trained_on}", f"train.epochs={EPOCHS}",
               "train.learning_rate=0.01", "model.init_from=models:/nightly@champion")
run = client.get_run(second.run_id)
for key in ("model.init_from", "data.version_range", "data.train_rows"):
    print(f"{key}: {run.data.params[key]}")
print("keras_dl.init_from:", run.data.tags["keras_dl.init_from"])
print("datasets:", sorted(i.dataset.name for i in run.inputs.dataset_inputs))
print("gate:", run.data.tags["keras_dl.gate"])""",
        md("## Where the champion is now"),
        """\
champion = client.get_model_version_by_alias("nightly", "champion")
print("champion -> version", champion.version, "| test_rmse", second.metrics["test_rmse"],
      "| registered", second.registered_version, "| not registered:", second.not_registered)""",
    )


class md(str):  # noqa: N801 - reads as a cell marker in the notebook sources above
    """A markdown cell (plain strings are code cells)."""


def _notebook(*cells: str) -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [new_markdown_cell(c) if isinstance(c, md) else new_code_cell(c) for c in cells]
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:02d}"  # stable ids: regenerating changes nothing that did not change
    return nb


def main() -> None:
    for name, build in (
        ("01_explore_data", explore),
        ("02_build_modules", build_modules),
        ("03_train_and_scale", train_and_scale),
        ("04_spark_ml_pipeline", spark_ml_pipeline),
        ("05_nightly_loop", nightly_loop),
    ):
        nbformat.write(build(), HERE / f"{name}.ipynb")


if __name__ == "__main__":
    main()
