"""``KerasModel``: the Transformer a :class:`~keras_dl.spark.KerasEstimator` fit returns.

``transform(df)`` scores on the executors by the path ``keras-dl predict`` uses
(:func:`keras_dl.inference.load_scorer`): the model travels once (``addFile``, or ``addArtifacts`` on Spark Connect), each Python
worker loads it once and calls it inside a ``tf.function`` on Arrow batches. The output follows
Spark ML, so its evaluators read it as it is:

- ``prediction`` (double): the class index for a classifier, the value for a regressor;
- ``probability`` (vector): the class probabilities, for classifiers only.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator

import numpy as np
import pandas as pd
from pyspark import keyword_only
from pyspark.ml import Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasPredictionCol, HasProbabilityCol
from pyspark.ml.util import MLReadable, MLWritable

from keras_dl.connect import is_connect, ship_file
from keras_dl.errors import ConfigError, DataError
from keras_dl.spark import columns

_SCORES = "__keras_dl_scores"


class KerasModel(Model, HasPredictionCol, HasProbabilityCol, MLWritable, MLReadable):
    """A trained keras.Model as a Spark ML Transformer.

    Args:
        feature_cols: The feature columns the model was trained on, in order.
        label_cols: The label column it was trained on (kept for reference).
        task: "multiclass", "binary" or "regression".
        from_logits: Whether the model outputs logits (softmax/sigmoid applied when scoring).
        run_id: The MLflow run that trained it.
        batch_size: Most rows per model call when scoring. Defaults to 1024.
    """

    feature_cols = Param(
        Params._dummy(), "feature_cols", "feature columns", TypeConverters.toListString
    )
    label_cols = Param(Params._dummy(), "label_cols", "label column", TypeConverters.toListString)
    task = Param(
        Params._dummy(), "task", "multiclass, binary or regression", TypeConverters.toString
    )
    from_logits = Param(
        Params._dummy(), "from_logits", "outputs are logits", TypeConverters.toBoolean
    )
    run_id = Param(
        Params._dummy(), "run_id", "the MLflow run that trained it", TypeConverters.toString
    )
    batch_size = Param(Params._dummy(), "batch_size", "rows per model call", TypeConverters.toInt)

    @keyword_only
    def __init__(self, **kwargs):
        super().__init__()
        self._setDefault(task=columns.REGRESSION, from_logits=False, batch_size=1024)
        self._set(**self._input_kwargs)
        self._model = None
        self._shipped: dict = {}

    # -- getters and setters -------------------------------------------------------------------

    def getModel(self):
        """The trained keras.Model."""
        return self._model

    def getRunId(self) -> str | None:
        """The id of the MLflow run that trained the model."""
        return self.getOrDefault(self.run_id) if self.isDefined(self.run_id) else None

    def getFeatureCols(self) -> list[str]:
        """The feature columns, in the order the model reads them."""
        return self.getOrDefault(self.feature_cols)

    def getLabelCols(self) -> list[str]:
        """The label column the model was trained on."""
        return self.getOrDefault(self.label_cols)

    def getTask(self) -> str:
        """ "multiclass", "binary" or "regression"."""
        return self.getOrDefault(self.task)

    def setPredictionCol(self, value: str) -> KerasModel:
        """Name the prediction column (default "prediction")."""
        return self._set(predictionCol=value)

    def setProbabilityCol(self, value: str) -> KerasModel:
        """Name the probability column of a classifier (default "probability")."""
        return self._set(probabilityCol=value)

    def setOutputCols(self, value: list[str]) -> KerasModel:
        """Name the output columns as in Horovod: ``[prediction]`` or, for a classifier,
        ``[prediction, probability]``.

        Raises:
            ConfigError: For more names than the model has outputs.
        """
        most = 1 if self.getTask() == columns.REGRESSION else 2
        if not 1 <= len(value) <= most:
            raise ConfigError(
                f"setOutputCols({value}): a {self.getTask()} model has {most} output column(s)"
                f" ({'prediction' if most == 1 else 'prediction, probability'})."
            )
        self.setPredictionCol(value[0])
        return self.setProbabilityCol(value[1]) if len(value) > 1 else self

    def getOutputCols(self) -> list[str]:
        """The output column names."""
        out = [self.getPredictionCol()]
        return out if self.getTask() == columns.REGRESSION else [*out, self.getProbabilityCol()]

    # -- scoring -------------------------------------------------------------------------------

    def _transform(self, df):
        from pyspark.ml.functions import array_to_vector

        if self._model is None:
            raise ConfigError("This KerasModel has no keras.Model: load it with KerasModel.load.")
        cols = self.getFeatureCols()
        features = columns.features_column(df, cols)
        taken = [c for c in self.getOutputCols() if c in df.columns]
        if taken:
            raise DataError(
                f"The DataFrame already has column(s) {', '.join(taken)}. Name the outputs "
                "otherwise with setPredictionCol / setProbabilityCol."
            )
        udf = _scoring_udf(
            self._ship(df.sparkSession),
            self.getTask(),
            self.getOrDefault(self.from_logits),
            self.getOrDefault(self.batch_size),
            int(self._model.input_shape[-1]),
            tuple(cols),
        )
        scored = df.withColumn(_SCORES, udf(features))
        out = [scored[c] for c in df.columns]
        out.append(scored[_SCORES]["prediction"].alias(self.getPredictionCol()))
        if self.getTask() != columns.REGRESSION:
            probability = array_to_vector(scored[_SCORES]["probability"])
            out.append(probability.alias(self.getProbabilityCol()))
        return scored.select(*out)

    def _ship(self, spark) -> str:
        """Send the model to the executors once per SparkContext (per Spark Connect session,
        whose artifacts are its own); return its file name."""
        key = spark.session_id if is_connect(spark) else id(spark.sparkContext)
        if key not in self._shipped:
            name = f"keras_dl_model_{uuid.uuid4().hex}.keras"
            path = os.path.join(tempfile.mkdtemp(prefix="keras_dl_model_"), name)
            self._model.save(path)
            ship_file(spark, path)
            self._shipped[key] = name
        return self._shipped[key]

    def _with_model(self, model) -> KerasModel:
        self._model, self._shipped = model, {}
        return self

    def copy(self, extra=None) -> KerasModel:
        """A copy with the same keras.Model (Spark ML copies Params, not attributes)."""
        that = super().copy(extra)
        that._model, that._shipped = self._model, dict(self._shipped)
        return that

    # -- persistence ---------------------------------------------------------------------------

    def write(self):
        """A writer of the Params (JSON) and the keras.Model (``model.keras``)."""
        from keras_dl.spark.persistence import KerasModelWriter

        return KerasModelWriter(self)

    @classmethod
    def read(cls):
        """A reader of what :meth:`write` saved."""
        from keras_dl.spark.persistence import KerasModelReader

        return KerasModelReader(cls)


def _scoring_udf(model_file: str, task: str, from_logits: bool, batch: int, width: int, cols):
    """The pandas UDF that scores one Arrow batch of feature arrays on an executor."""
    from pyspark.sql import types as T
    from pyspark.sql.functions import pandas_udf

    schema = T.StructType(
        [
            T.StructField("prediction", T.DoubleType()),
            T.StructField("probability", T.ArrayType(T.DoubleType())),
        ]
    )

    def score(batches: Iterator[pd.Series]) -> Iterator[pd.DataFrame]:
        from keras_dl.inference import load_scorer

        model = load_scorer(model_file, keras_flavor=True)
        for series in batches:
            if series.isna().any():
                raise DataError(
                    f"Feature column(s) {', '.join(cols)} hold nulls in rows to score. Fill or "
                    "drop them before transform."
                )
            x = np.stack(series.to_numpy()).astype(np.float32) if len(series) else None
            if x is None:
                yield pd.DataFrame({"prediction": [], "probability": []})
                continue
            if x.shape[1] != width:
                raise DataError(
                    f"Feature column(s) {', '.join(cols)} give {x.shape[1]} values per row; "
                    f"the model takes {width}. Assemble the same columns as when fitting."
                )
            y = np.concatenate([model(x[i : i + batch]) for i in range(0, len(x), batch)])
            yield _outputs(y.astype(np.float64), task, from_logits)

    return pandas_udf(score, schema)


def _outputs(y: np.ndarray, task: str, from_logits: bool) -> pd.DataFrame:
    if task == columns.MULTICLASS:
        if from_logits:
            y = np.exp(y - y.max(axis=1, keepdims=True))
            y = y / y.sum(axis=1, keepdims=True)
        return pd.DataFrame({"prediction": y.argmax(1).astype(np.float64), "probability": list(y)})
    if task == columns.BINARY:
        p = y.reshape(len(y), -1)[:, -1]
        p = 1 / (1 + np.exp(-p)) if from_logits else p
        probability = np.stack([1 - p, p], axis=1)
        return pd.DataFrame(
            {"prediction": (p > 0.5).astype(np.float64), "probability": list(probability)}
        )
    return pd.DataFrame({"prediction": y.reshape(len(y), -1)[:, 0], "probability": None})
