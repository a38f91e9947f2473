"""TF's ``MultiWorkerMirroredStrategy`` (MWMS) for Keras 3: what keras_dl fixes, and how a worker
joins.

Keras 3.15's TensorFlow trainer (``keras/src/backend/tensorflow/trainer.py``) breaks under MWMS
with more than one worker (keras#20585, open since 2024-12), in two places that assume
``MirroredStrategy``'s values:

* ``TensorFlowTrainer._maybe_symbolic_build`` builds the model from the first distributed batch,
  which it gets with ``strategy.reduce("MEAN", batch, axis=None)``. That is an all-reduce of
  the *data* across replicas, just to learn its shapes: under ``MirroredStrategy`` it is a local
  mean of per-device tensors, but under MWMS the per-replica batch of a distributed dataset
  cannot be reduced that way (``ValueError: Attempt to convert a value (PerReplica:{...}) with
  an unsupported type``), and even where it could, it would be a network collective over the
  batch (and a mean of integer labels). It also reads that batch through an iterator of its
  own, which it then drops: its prefetch reads ahead (on keras_dl's stream, rows counted as
  handed to training twice). :func:`fix_keras` builds from the distributed dataset's
  ``element_spec`` (one replica's: shapes and dtypes are all ``_symbolic_build`` reads), else
  from this worker's first replica's batch, ``experimental_local_results(batch)[0]``: no
  collective either way.
* ``reduce_per_replica`` (the module function every compiled train, test and predict step calls
  on its outputs) has a branch for multi-worker MWMS that runs before its ``PerReplica`` check:
  ``strategy.reduce("MEAN", value, axis=0)``. ``axis=0`` also reduces each replica's value
  along its first dimension, and a step's outputs are its metrics, scalars: ``Invalid reduction
  dimension 0 for input with 0 dimensions``. (A vector metric would be averaged over its
  entries.) MirroredStrategy's branch, ``tf.reduce_mean(local_results, axis=0)``, is the mean
  *over replicas*; :func:`fix_keras` makes MWMS's the same, ``strategy.reduce("MEAN", value,
  axis=None)`` (and ``"SUM"`` likewise), so every worker gets the same logs. ``"concat"``
  (``predict``) and ``"first"`` are left to Keras.

:func:`fix_keras` runs only in a worker of ``runtime.strategy=multiworker`` (:func:`init`). The
``reduce_per_replica`` replacement delegates to Keras' own unless the strategy is MWMS in
multi-worker mode; the build replacement applies to a one-worker job too (MWMS outside
multi-worker mode, e.g. a resume with ``runtime.np=-1``), whose Keras build read ahead the same
way (rows_trained 2502 and 2514 of 1257 in the resumed epochs).

The data: Keras' epoch iterator hands a plain ``tf.data.Dataset`` to
``strategy.experimental_distribute_dataset``, which under MWMS takes its batch for the *global*
batch: it auto-shards it over the workers (by file or by element) and cuts every batch into
``num_replicas_in_sync`` pieces. keras_dl's data is already sharded, row-exact, by worker
(``make_splits(..., rank, world_size)``) at the per-worker batch, with zero-weight padding so
every worker runs the same steps: :func:`worker_dataset` distributes it as it is
(``distribute_datasets_from_function``, auto-shard OFF), so each worker trains its own shard,
as under Horovod.

Use it in your own ``fit`` (under :class:`~keras_dl.launch.MultiWorkerRunner` or any launcher
that sets ``TF_CONFIG``)::

    from keras_dl.distribute import multiworker

    strategy = multiworker.init()          # before any other TensorFlow op in the process
    with strategy.scope():
        model = make_model(); model.compile(...)
    model.fit(multiworker.worker_dataset(strategy, my_shard), steps_per_epoch=..., ...)
"""

from __future__ import annotations

import json
import os

from keras_dl.distribute.world import World
from keras_dl.errors import ConfigError

_state: dict = {}  # "strategy": the process's MWMS, "world": its World (set by init)


def init(timeout_seconds: float | None = None):
    """Create this process's ``MultiWorkerMirroredStrategy`` (once) and fix Keras for it.

    Collective: blocks until every worker in ``TF_CONFIG`` has started its server. Call it
    before TensorFlow runs any op in the process (TF's rule for MWMS).

    Args:
        timeout_seconds: How long one collective may wait for a peer before it fails (TF's
            ``CommunicationOptions``), and how long a worker may send TF's coordination
            service no heartbeat before it is declared unhealthy
            (:mod:`~keras_dl.distribute.mw_coordination`). Defaults to None: TF's defaults
            (collectives wait for ever; a heartbeat timeout of 10 s).

    Returns:
        The strategy.

    Raises:
        ConfigError: ``TF_CONFIG`` is missing or names no worker task.
    """
    if "strategy" in _state:
        return _state["strategy"]
    rank, size = tf_config_task()
    import tensorflow as tf

    from keras_dl.distribute import mw_coordination

    mw_coordination.configure(timeout_seconds)
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout_seconds)
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    except RuntimeError as exc:
        if "must be configured at program startup" not in str(exc):
            raise
        raise ConfigError(
            f"Worker {rank} of {size} cannot create TF's MultiWorkerMirroredStrategy: TensorFlow "
            f"already ran an op in this process ({exc}). Create the strategy first in the "
            "worker's main, before loading a model or building tensors: "
            "keras_dl.distribute.multiworker.init() (keras_dl.train.fit creates it when it is "
            "the first thing the main does)."
        ) from exc
    fix_keras()
    _state["strategy"] = strategy
    _state["world"] = World(rank=rank, size=size)
    return strategy


def current_strategy():
    """The strategy :func:`init` made in this process, or None."""
    return _state.get("strategy")


def world() -> World | None:
    """This worker's :class:`World` (rank = its task index) once :func:`init` ran, else None."""
    return _state.get("world")


def tf_config_task(environ=os.environ) -> tuple[int, int]:
    """``(task index, number of workers)`` from ``TF_CONFIG``.

    Raises:
        ConfigError: ``TF_CONFIG`` is missing, not JSON, or its task is not a worker.
    """
    text = environ.get("TF_CONFIG")
    if not text:
        raise ConfigError(
            "runtime.strategy=multiworker needs TF_CONFIG in the environment (its cluster's "
            "workers and this task's index): run it with `keras-dl train ... --set "
            "runtime.np=N`, keras_dl.launch.launch(exp) (from a notebook) or "
            "keras_dl.launch.MultiWorkerRunner, which set it."
        )
    try:
        config = json.loads(text)
        workers = config["cluster"]["worker"]
        task = config["task"]
        index = int(task["index"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"TF_CONFIG={text!r} is not a TF cluster spec with a worker task ({exc}); it needs "
            '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": i}}.'
        ) from None
    if task.get("type") != "worker" or not 0 <= index < len(workers):
        raise ConfigError(
            f"TF_CONFIG's task {task!r} is not one of its {len(workers)} workers: keras_dl runs "
            "MultiWorkerMirroredStrategy on workers only (worker 0 is the chief)."
        )
    return index, len(workers)


def fix_keras() -> None:
    """Replace the two Keras functions that fail under multi-worker MWMS (idempotent).

    See the module's docstring for what each did and why the replacement is right. The
    replacements call Keras' originals whenever the strategy is not MWMS in multi-worker mode.
    """
    from keras.src.backend.tensorflow import trainer

    if getattr(trainer.reduce_per_replica, "_keras_dl_fixed", False):
        return
    original_reduce = trainer.reduce_per_replica
    original_build = trainer.TensorFlowTrainer._maybe_symbolic_build

    def reduce_per_replica(values, strategy, reduction):
        if _multi_worker(strategy) and reduction in ("auto", "mean", "sum"):
            op = "SUM" if reduction == "sum" else "MEAN"
            return _map(lambda v: strategy.reduce(op, v, axis=None), values)
        return original_reduce(values, strategy, reduction)

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        # Any strategy (one worker of a multi-worker job too, or MirroredStrategy): Keras' own
        # build pulls a batch through an iterator of its own, which reads the stream ahead
        # (rows_trained counted 2514 of 1257 rows in the epochs it read ahead into).
        if strategy is None or iterator is None:
            return original_build(self, iterator=iterator, data_batch=data_batch)
        data_batch = _first_replica_spec(iterator)
        if data_batch is None:
            for _, _, it in iterator:  # Keras' own loop: the first batch of the first epoch
                data_batch = _map(lambda v: _first_local(strategy, v), next(it))
                break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    reduce_per_replica._keras_dl_fixed = True
    trainer.reduce_per_replica = reduce_per_replica
    trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build


def worker_dataset(strategy, dataset):
    """``dataset`` as this worker's input under ``strategy``: its own shard, at its own batch.

    Under multi-worker MWMS it is distributed with ``distribute_datasets_from_function``
    (auto-shard OFF), so Keras neither shards it again nor splits its batches: each step trains
    one batch of ``dataset`` per worker. With several devices per worker, each batch is cut
    into one piece per device. Elsewhere ``dataset`` is returned as it is.

    Args:
        strategy: The model's ``distribute_strategy``.
        dataset: This worker's batched ``tf.data.Dataset`` (or None).

    Returns:
        A distributed dataset for ``model.fit`` / ``evaluate``, or ``dataset`` unchanged.
    """
    if dataset is None or not _multi_worker(strategy):
        return dataset
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = dataset.with_options(options)
    local = len(strategy.extended.worker_devices)

    def per_worker(context):
        if local == 1:
            return dataset
        # One batch per device and step: the worker's batch, cut in `local` pieces in turn.
        return dataset.unbatch().batch(_per_device_batch(dataset, local))

    return strategy.distribute_datasets_from_function(per_worker)


def local_model(model, build=None):
    """``model`` for one worker alone: under multi-worker MWMS, a copy with its weights outside
    the strategy; elsewhere ``model`` itself.

    A model of the strategy runs a collective in every ``predict`` and ``evaluate`` step, so a
    call on one worker (the chief's plots, its gate, its logged model's signature) would wait
    for peers that are not calling it.

    Args:
        model: A model built under the strategy's scope.
        build: ``fn()`` that builds the same architecture; defaults to
            ``keras.models.clone_model`` (Sequential and functional models).
    """
    if not _multi_worker(model.distribute_strategy):
        return model
    import keras

    copy = build() if build is not None else keras.models.clone_model(model)  # default strategy
    copy.set_weights(model.get_weights())
    return copy


# -- private helpers ---------------------------------------------------------------------------


def _multi_worker(strategy) -> bool:
    import tensorflow as tf

    return (
        isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        and strategy.extended._in_multi_worker_mode()
    )


def _first_replica_spec(epoch_iterator):
    """The element spec of one replica's batch of the iterator's distributed dataset, or None."""
    spec = getattr(getattr(epoch_iterator, "_distributed_dataset", None), "element_spec", None)
    if spec is None:
        return None

    def one(s):
        values = getattr(s, "_value_specs", None)  # a PerReplicaSpec: several local devices
        return values[0] if values else s

    return _map(one, spec)


def _first_local(strategy, value):
    import tensorflow as tf

    if isinstance(value, tf.distribute.DistributedValues):
        return strategy.experimental_local_results(value)[0]
    return value


def _map(fn, values):
    from keras.src import tree

    return tree.map_structure(fn, values)


def _per_device_batch(dataset, devices: int) -> int:
    """The batch each of ``devices`` gets from ``dataset``'s (static, divisible) batch."""
    import tensorflow as tf

    spec = tf.nest.flatten(dataset.element_spec)[0]
    batch = spec.shape[0]
    if batch is None or batch % devices:
        raise ConfigError(
            f"A worker's batch ({batch}) must be a known multiple of its {devices} devices under "
            "runtime.strategy=multiworker: use a train.batch_size divisible by "
            f"workers x {devices}."
        )
    return batch // devices
