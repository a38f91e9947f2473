"""``KerasEstimator``: a Spark ML Estimator that trains a Keras model through keras_dl.

Example::

    from pyspark.ml import Pipeline
    from pyspark.ml.feature import StandardScaler, VectorAssembler
    from keras_dl.spark import KerasEstimator

    est = KerasEstimator(feature_cols=["features"], label_cols=["label"])  # no model: tabular
    est = KerasEstimator(model=model, loss="sparse_categorical_crossentropy",
                         metrics=["accuracy"], feature_cols=["scaled"], label_cols=["label"],
                         validation=0.2, batch_size=16, epochs=20, store="/tmp/keras_dl_store")
    pipeline = Pipeline(stages=[VectorAssembler(...), StandardScaler(...), est])
    model = pipeline.fit(train_df)              # a PipelineModel ending in a KerasModel
    scored = model.transform(test_df)           # + prediction (double), probability (vector)

``fit`` checks the columns, writes the features and label as a Delta table under
``store/data`` named by a fingerprint of the rows (:func:`keras_dl.data.make_spark_converter`
with ``persistent=True``: the same rows are written once, and found again by a new process),
and trains with :func:`keras_dl.train.fit`: one MLflow run with the config, lineage, metrics
and model, and checkpoints under ``store/runs``. ``setRunId(id)`` resumes a run from its last
checkpoint, from this process or a new one. Inside an active MLflow run, or under
``CrossValidator`` / ``TrainValidationSplit`` (over the estimator or a Pipeline holding it)
started inside one, each fit is a child run of it.

``store`` may be an object-store URI (``s3://bucket/prefix``, credentials and endpoint from the
standard AWS environment, see :mod:`keras_dl.storage`): the data and the run folders
(``store/runs/<id>``: checkpoints, ``run.json``, ``config.yaml``, the run's lease) are written
there, so a run resumes from any machine that reaches the store.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

from pyspark import keyword_only
from pyspark.ml import Estimator

from keras_dl.errors import ConfigError
from keras_dl.spark import columns, default_model, runs
from keras_dl.spark.model import KerasModel
from keras_dl.spark.params import EstimatorParams
from keras_dl.spark.training import NAME, make_compile_spec, runtime_of, train, with_learning_rate


class KerasEstimator(Estimator, EstimatorParams):
    """Train a keras.Model on a Spark DataFrame; ``fit`` returns a :class:`KerasModel`.

    Args:
        model: A keras.Model, compiled or not. Each fit trains a clone that starts from its
            weights; the model itself is never changed. Defaults to None: the tabular
            recipe's network, batch size, epochs and early stopping, chosen from the rows, with
            20 % of them validating unless ``validation`` is set
            (:mod:`keras_dl.spark.default_model`).
        optimizer: A Keras optimizer name or instance (copied for each fit). Defaults to the
            compiled model's, else "adam".
        loss: A Keras loss. "sparse_categorical_crossentropy" (class indexes) and
            "binary_crossentropy" make a classifier (``prediction`` and ``probability``);
            any other loss a regressor. Defaults to the compiled model's.
        metrics: Keras metrics. Defaults to the compiled model's, else none.
        feature_cols: Feature columns (vectors, numeric arrays, numbers), concatenated in
            this order into the model's one input.
        label_cols: The label column, as a one-item list (or a string).
        sample_weight_col: A numeric column of per-row sample weights (finite, >= 0), as
            Horovod's ``sample_weight_col``: it weighs the loss and the validation metrics and
            is never a model input (``data.weight_column``). Defaults to None (weight 1).
        validation: A fraction of rows (chosen by a hash of each row and ``random_seed``) or a
            column whose true/1 rows validate. Defaults to None (no validation).
        batch_size: Global training batch. Defaults to 32.
        val_batch_size: Batch for validation and scoring. Defaults to ``batch_size``.
        epochs: Defaults to 1.
        num_proc: HorovodRunner's np: 1 trains in this process (with ``strategy``), -N on N
            local processes, N on N Spark tasks: Horovod's ranks, or with
            ``strategy="multiworker"`` TF's MultiWorkerMirroredStrategy workers. Defaults to 1.
        store: Folder or URI (``s3://bucket/prefix``) for the materialized data
            (``store/data``, kept for later fits and resumes) and the run folders with their
            checkpoints (``store/runs/<id>``). Defaults to ``keras_dl_store`` in the temp folder.
        callbacks: Extra Keras callbacks. Defaults to none.
        random_seed: Seeds weights, shuffling and the validation split. Defaults to 42.
        verbose: Keras fit verbosity. Defaults to 0.
        run_id: An MLflow run, of a fit that failed or was killed, to resume from its last
            checkpoint (same store and data; this or a new process, or another machine for an
            object-store store). Defaults to None.
        experiment: A keras_dl :class:`~keras_dl.config.Experiment` or a list of
            ``"section.key=value"`` overrides for what no Param sets (``tracking.uri``,
            ``callbacks.patience``, ``train.learning_rate``...), or an MLflow experiment name.
            Defaults to None.
        registered_model: Register the trained model in MLflow under this name. Defaults to
            None (logged with the run, not registered).
        strategy: "auto", "none" or "mirrored" for ``num_proc=1``; "multiworker" for
            ``num_proc`` other than 1 picks TF's multi-worker strategy instead of Horovod.
            Defaults to "auto".
        learning_rate: The optimizer's learning rate. Defaults to None: the default model's
            (the tabular recipe's), or the given optimizer's.
        hidden_units: Widths of the default model's hidden layers. Defaults to None: the
            tabular recipe's (64, 32).
    """

    @keyword_only
    def __init__(self, **kwargs):
        super().__init__()
        self._set_defaults()
        self._set(**self._input_kwargs)

    @keyword_only
    def setParams(self, **kwargs):
        """Set any Params by keyword; returns the estimator."""
        return self._set(**self._input_kwargs)

    def copy(self, extra=None):
        """As Spark ML's; the copy also remembers the MLflow run active in this thread.

        ``CrossValidator`` and ``TrainValidationSplit`` copy the estimator (or the Pipeline
        holding it) in the caller's thread, then fit the copies in pool threads, where MLflow
        sees no active run. A copy's fit is a child of the remembered run while that run is
        still running.
        """
        that = super().copy(extra)
        active = runs.active_run_id()
        if active:
            that._parent_run = active
        return that

    def _fit(self, df) -> KerasModel:
        model = self.getModel()
        features, labels = self.getFeatureCols(), self.getLabelCols()
        if not features or not labels or len(labels) != 1:
            raise ConfigError(
                f"KerasEstimator needs feature_cols and one label column; got feature_cols="
                f"{features}, label_cols={labels}."
            )
        label = labels[0]
        columns.check_label_type(df, label)
        validation = self.getValidation()
        if model is None:  # the tabular recipe's model, sizing and early stopping
            spec = None
            task = default_model.infer_task(df, label, self.getLoss())
            outputs = default_model.MAX_CLASSES if task == columns.MULTICLASS else 1
            if not self.isSet(self.validation):
                validation = default_model.DEFAULT_VALIDATION
        else:
            spec = make_compile_spec(model, self.getOptimizer(), self.getLoss(), self.getMetrics())
            spec = with_learning_rate(spec, self.getLearningRate())
            task = columns.task_of(spec.loss)
            outputs = int(model.output_shape[-1])
        if task == columns.REGRESSION and outputs != 1:
            raise ConfigError(
                f"loss={spec.loss!r} makes a regressor, whose model needs one output; this one "
                f"has {outputs}. Use 'sparse_categorical_crossentropy' to classify."
            )
        if self.getSampleWeightCol():
            columns.check_weight_type(df, self.getSampleWeightCol())
        if isinstance(validation, str):
            columns.check_present(df, [validation], "validation")
        feature_array = columns.features_column(df, features)
        layout = columns.check_data(df, features, label, task, outputs)
        if model is not None:
            _check_width(model, layout)
        table = self._materialize(df, feature_array, label, task, validation)
        exp = self._experiment(table, validation)
        if model is None:
            exp = default_model.tabular_experiment(
                exp, task, self._sizes_set(), self.getLearningRate(), self.getHiddenUnits()
            )
        parent = runs.active_run_id() or runs.running(exp, getattr(self, "_parent_run", None))
        if parent:
            exp = runs.in_parent_experiment(exp, parent)
        run_id = self.getRunId()
        exp = runs.place_run_dir(exp, self._store(), run_id)
        try:
            if model is None:
                if exp.runtime.np != 0:
                    raise ConfigError(
                        f"num_proc={self.getNumProc()}: the default model (no model given) "
                        "trains in this process; pass num_proc=1, or a model."
                    )
                run_id, trained = default_model.train_default(
                    exp, self.getCallbacks() or (), run_id
                )
                trained = default_model.single_input(trained, layout.width)
            else:
                run_id, trained = train(exp, model, spec, self.getCallbacks() or (), run_id)
        except BaseException as exc:
            failed = runs.recorded_run(exp)
            if failed and parent:
                runs.tag_parent(exp, failed, parent)
            if failed and hasattr(exc, "add_note"):
                exc.add_note(
                    f"MLflow run {failed}: resume it with setRunId({failed!r}) and fit again "
                    f"(with the same store and data, from this or a new process)."
                )
            raise
        if parent:
            runs.tag_parent(exp, run_id, parent)
        # Not _copyValues: the estimator's run_id (a run to resume) is not the model's.
        return KerasModel(
            feature_cols=features,
            label_cols=[label],
            task=task,
            from_logits=bool(spec and spec.from_logits),
            run_id=run_id,
            batch_size=self.getValBatchSize() or self.getBatchSize(),
        )._with_model(trained)

    # -- what fit is made of -------------------------------------------------------------------

    def _sizes_set(self) -> dict:
        """The batch size and epochs the user set (the default model chooses the others)."""
        return {
            name: getattr(self, f"get{name.title().replace('_', '')}")()
            for name in ("batch_size", "epochs")
            if self.isSet(getattr(self, name))
        }

    def _materialize(self, df, feature_array, label: str, task: str, validation) -> str:
        """Write features, label (and split) as a Delta table under store, once per content.

        The table is named by a fingerprint of its rows, so a new process fitting the same
        data finds it (and a run resumed there sees the same ``data.table``).
        """
        from pyspark.sql import functions as F

        from keras_dl.data import make_spark_converter

        label_type = "int" if task == columns.MULTICLASS else "float"
        cols = [
            feature_array.alias(columns.FEATURES),
            columns._col(label).cast(label_type).alias(columns.LABEL),
        ]
        if self.getSampleWeightCol():
            cols.append(
                columns._col(self.getSampleWeightCol()).cast("double").alias(columns.WEIGHT)
            )
        if isinstance(validation, str):
            is_val = F.coalesce(columns._col(validation).cast("boolean"), F.lit(False))
            cols.append(F.when(is_val, "validation").otherwise("train").alias(columns.SPLIT))
        elif validation:
            # A hash of the row and the seed, not rand(): rand() follows the partitioning and
            # row order, which a shuffle may change from one process (or one action) to the
            # next; a row's hash is the same everywhere.
            row_hash = F.xxhash64(F.lit(self.getRandomSeed()), feature_array, columns._col(label))
            is_val = F.pmod(row_hash, F.lit(1_000_000)) < F.lit(round(validation * 1_000_000))
            cols.append(F.when(is_val, "validation").otherwise("train").alias(columns.SPLIT))
        converter = make_spark_converter(
            df.select(*cols),
            cache_dir=f"{self._store()}/data",
            table_format="delta",
            persistent=True,
        )
        return converter.path

    def _experiment(self, table: str, validation=None):
        """The keras_dl Experiment of this fit: the ``experiment`` Param, then the others."""
        from keras_dl.config import Experiment, TrackingConfig, resolve

        base = self.getExperiment()
        sets: list[str] = []
        if isinstance(base, str):
            base = Experiment(tracking=TrackingConfig(experiment=base))
        elif isinstance(base, (list, tuple)):
            base, sets = Experiment(), list(base)
        elif base is None:
            base = Experiment()
        strategy, np = runtime_of(self.getNumProc(), self.getStrategy())
        data = dataclasses.replace(
            base.data,
            table=table,
            label=columns.LABEL,
            weight_column=columns.WEIGHT if self.getSampleWeightCol() else None,
            features=(columns.FEATURES,),
            split_column=columns.SPLIT if validation else None,
            test_split="",
            seed=self.getRandomSeed(),
        )
        optimizer = self.getOptimizer()
        train_cfg = dataclasses.replace(
            base.train,
            epochs=self.getEpochs(),
            batch_size=self.getBatchSize(),
            seed=self.getRandomSeed(),
            verbose=self.getVerbose(),
            **({"optimizer": optimizer} if isinstance(optimizer, str) else {}),
            **({"learning_rate": self.getLearningRate()} if self.getLearningRate() else {}),
        )
        runtime = dataclasses.replace(
            base.runtime,
            strategy=strategy,
            np=np,
        )
        tracking = dataclasses.replace(
            base.tracking,
            uri=base.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI", ""),
            registered_model=self.getRegisteredModel() or base.tracking.registered_model or "none",
        )
        exp = dataclasses.replace(
            base, recipe=NAME, data=data, train=train_cfg, runtime=runtime, tracking=tracking
        )
        return resolve(exp, sets=sets)

    def _store(self) -> str:
        store = self.getStore() or os.path.join(tempfile.gettempdir(), "keras_dl_store")
        return store.removeprefix("file://").rstrip("/")


def _check_width(model, layout: columns.FeatureLayout) -> None:
    expected = model.input_shape
    if isinstance(expected, list) or len(expected) != 2 or expected[-1] != layout.width:
        detail = ", ".join(f"{c} ({w})" for c, w in zip(layout.columns, layout.widths))
        raise ConfigError(
            f"The model takes input of shape {expected}, but feature_cols give {layout.width} "
            f"values per row: {detail}. Build the model with keras.Input(({layout.width},))."
        )
