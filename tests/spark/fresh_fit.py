"""One ``KerasEstimator.fit`` in a fresh Python process, for the resume tests.

    python -m tests.spark.fresh_fit STORE [--run-id ID] [--kill-after-epoch N] [--set KEY=VALUE]

Fits iris (features assembled into a vector, validation by an ``is_val`` column) on a local[2]
SparkSession of its own, tracked where ``MLFLOW_TRACKING_URI`` points. With
``--kill-after-epoch N`` the process kills itself with SIGKILL at the end of epoch N (0-based),
after the checkpoint of that epoch is written: nothing of keras_dl's gets to clean up.
``--set`` adds an experiment override (repeatable). STORE may be an ``s3://`` URI (the AWS
variables of the environment reach the store). On success it prints one JSON line:
``{"run_id": ..., "table": ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("--run-id")
    parser.add_argument("--kill-after-epoch", type=int)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--set", action="append", default=[], dest="sets")
    args = parser.parse_args()

    import keras
    import mlflow
    import pandas as pd
    from pyspark.ml.feature import VectorAssembler
    from sklearn.datasets import load_iris

    from keras_dl.inference.tables import spark_session
    from keras_dl.spark import KerasEstimator
    from tests.spark.conftest import make_model

    spark = spark_session("local[2]", "keras_dl-tests-fresh-fit")
    spark.sparkContext.setLogLevel("ERROR")
    data = load_iris()
    frame = pd.DataFrame(data.data, columns=["sl", "sw", "pl", "pw"])
    frame["label"] = data.target.astype("float64")
    frame["is_val"] = [i % 5 == 0 for i in range(len(frame))]
    df = VectorAssembler(inputCols=["sl", "sw", "pl", "pw"], outputCol="x").transform(
        spark.createDataFrame(frame)
    )

    class KillAfter(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == args.kill_after_epoch:
                os.kill(os.getpid(), signal.SIGKILL)

    est = KerasEstimator(
        model=make_model(),
        optimizer="adam",
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        feature_cols=["x"],
        label_cols=["label"],
        validation="is_val",
        batch_size=30,
        epochs=args.epochs,
        store=args.store,
        run_id=args.run_id,
        callbacks=[KillAfter()] if args.kill_after_epoch is not None else None,
        experiment=["callbacks.plots=false", "tracking.log_model=false", *args.sets],
    )
    model = est.fit(df)
    run = mlflow.MlflowClient().get_run(model.getRunId())
    print(json.dumps({"run_id": model.getRunId(), "table": run.data.tags["data.table"]}))
    spark.stop()


if __name__ == "__main__":
    main()
