"""The estimator's model as a keras_dl Recipe, trained by the one training path.

There is no second training loop: :func:`train` builds a :class:`~keras_dl.recipe.Recipe`
whose ``build_model`` clones the estimator's model (with its weights) and whose loss, metrics
and optimizer come from the Params, then calls :func:`keras_dl.train.fit` in this process or,
with ``num_proc`` asking for Horovod, on every rank through
:func:`keras_dl.launch.launch`. Everything is passed as serialized Keras configs, so
it pickles to the ranks.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, replace
from typing import Any

from keras_dl import storage
from keras_dl.errors import ConfigError

NAME = "keras_estimator"  # the recipe name runs are tagged with (keras_dl.recipe)


@dataclass(frozen=True)
class CompileSpec:
    """Loss, metrics and optimizer as Keras-serialized values (names or config dicts)."""

    loss: Any
    metrics: tuple
    optimizer: Any  # a name (str) or a serialized optimizer (dict)

    def compile_options(self) -> dict:
        """Fresh Keras objects for one ``model.compile`` (metrics hold state: never share)."""
        import keras

        options = {
            "loss": keras.losses.get(self.loss),
            "metrics": [m if isinstance(m, str) else keras.metrics.get(m) for m in self.metrics],
        }
        if isinstance(self.optimizer, dict):
            options["optimizer"] = keras.optimizers.deserialize(self.optimizer)
        return options

    @property
    def from_logits(self) -> bool:
        """Whether the loss reads the model's outputs as logits (scoring applies softmax)."""
        config = self.loss.get("config", {}) if isinstance(self.loss, dict) else {}
        return bool(config.get("from_logits", False))


def make_compile_spec(model, optimizer=None, loss=None, metrics=None) -> CompileSpec:
    """Loss, metrics and optimizer from the Params, else from a compiled model.

    Raises:
        ConfigError: When neither the Params nor a compiled model give a loss.
    """
    import keras

    compiled = model.get_compile_config() if getattr(model, "compiled", False) else {}
    loss = loss if loss is not None else compiled.get("loss")
    if loss is None:
        raise ConfigError(
            "KerasEstimator has no loss: set loss= (e.g. 'sparse_categorical_crossentropy' for "
            "class indexes, 'mse' for values), or pass a compiled model."
        )
    if metrics is None:
        metrics = compiled.get("metrics") or ()
    optimizer = optimizer if optimizer is not None else compiled.get("optimizer", "adam")
    return CompileSpec(
        loss=loss if isinstance(loss, (str, dict)) else keras.losses.serialize(loss),
        metrics=tuple(
            m if isinstance(m, (str, dict)) else keras.metrics.serialize(m) for m in metrics
        ),
        optimizer=optimizer
        if isinstance(optimizer, (str, dict))
        else keras.optimizers.serialize(optimizer),
    )


def with_learning_rate(spec: CompileSpec, rate: float | None) -> CompileSpec:
    """``spec`` with the ``learning_rate`` Param in its serialized optimizer, when both exist."""
    if rate is None or not isinstance(spec.optimizer, dict):
        return spec  # a name: train.learning_rate carries the rate
    config = {**spec.optimizer.get("config", {}), "learning_rate": rate}
    return replace(spec, optimizer={**spec.optimizer, "config": config})


def make_recipe(model, spec: CompileSpec, exp):
    """A Recipe whose model is a fresh clone of ``model``, starting from its weights."""
    from keras_dl.recipe import Recipe

    def build_model(data, exp):
        import keras

        try:
            clone = keras.models.clone_model(model)
        except Exception as exc:
            raise ConfigError(
                f"KerasEstimator could not clone the model with keras.models.clone_model: {exc}. "
                "Use a Sequential or functional model, or give the subclass get_config()."
            ) from exc
        if model.weights:
            clone.set_weights(model.get_weights())  # every trial starts from the same weights
        return clone

    return Recipe(
        name=NAME,
        description="a keras.Model given to keras_dl.spark.KerasEstimator",
        defaults=exp,
        build_model=build_model,
        compile_options=lambda data, exp: spec.compile_options(),
    )


def runtime_of(num_proc: int, strategy: str) -> tuple[str, int]:
    """``(runtime.strategy, runtime.np)`` for the estimator's ``num_proc`` and ``strategy``:
    in this process for 1, -1 or 0; else Horovod's ranks, or the multi-worker strategy's
    workers when ``strategy`` is "multiworker".

    Raises:
        ConfigError: "multiworker" with ``num_proc`` asking for one process.
    """
    if num_proc not in (1, -1, 0):
        return ("multiworker" if strategy == "multiworker" else "horovod"), num_proc
    if strategy == "multiworker":
        raise ConfigError(
            f"strategy='multiworker' with num_proc={num_proc}: the multi-worker strategy "
            "trains on several worker processes. Give num_proc=-N (N local processes) or N "
            "(N Spark tasks), N >= 2, or strategy='auto' for one process."
        )
    return strategy, 0


def train(exp, model, spec: CompileSpec, callbacks=(), run_id: str | None = None):
    """Train in this process, or on Horovod ranks or multi-worker workers when
    ``exp.runtime.np`` asks for them.

    Returns:
        The MLflow run id and the trained keras.Model.
    """
    if exp.runtime.np == 0:
        from keras_dl.train import fit

        result = fit(exp, make_recipe(model, spec, exp), callbacks=callbacks, run_id=run_id)
        return result.run_id, result.model
    import functools

    from keras_dl.launch import launch

    # The hand-off files live in run_dir, which every rank can reach (a shared folder, or the
    # object store): a Spark task on another machine has no view of this driver's temp folder.
    source = storage.join(exp.runtime.run_dir, "source_model.keras")
    trained = storage.join(exp.runtime.run_dir, "trained_model.keras")
    save_model(model, source)  # the ranks load it: a file pickles, a live model may not
    main = functools.partial(
        _train_rank, source=source, out=trained, spec=spec, callbacks=list(callbacks)
    )
    result = launch(exp, main, run_id=run_id)  # continues run_id, when given
    return result.run_id, load_model(trained)


def save_model(model, uri: str) -> None:
    """Save a keras.Model as a ``.keras`` file at a local path or an object-store URI.

    Keras writes local files only: the file is written in a temporary folder, then copied in
    whole (:meth:`keras_dl.storage.Store.upload`).
    """
    store, name = storage.store_of(uri)
    with tempfile.TemporaryDirectory(prefix="keras_dl_model_") as tmp:
        path = os.path.join(tmp, name)
        model.save(path)
        store.upload(path, name)


def load_model(uri: str):
    """The keras.Model (uncompiled) of a ``.keras`` file at a local path or an object-store URI."""
    import keras

    store, name = storage.store_of(uri)
    with tempfile.TemporaryDirectory(prefix="keras_dl_model_") as tmp:
        path = os.path.join(tmp, name)
        store.download(name, path)
        return keras.saving.load_model(path, compile=False)


def _train_rank(exp, run_id=None, *, source: str, out: str, spec: CompileSpec, callbacks):
    """Every rank (or worker): load the source model, fit its shard; rank 0 saves the result."""
    from keras_dl.train import fit

    if exp.runtime.strategy == "multiworker":
        from keras_dl.distribute.strategy import make_strategy

        # Before load_model runs TensorFlow's first op: TF's rule for the multi-worker strategy
        # (fit then finds it made).
        make_strategy("multiworker", exp.runtime.stall_timeout)
    model = load_model(source)
    result = fit(exp, make_recipe(model, spec, exp), callbacks=callbacks, run_id=run_id)
    if result.run_id:  # only the chief has a run id
        save_model(result.model, out)
    result.model = None
    return result
