"""The experiment's settings: plain frozen dataclasses with their defaults and documentation.

One dataclass per config section (``data``, ``train``, ``runtime``, ``tracking``, ``callbacks``,
``registry``, ``tune``) and :class:`Experiment`, which holds them and the recipe's own ``model`` section.
A field's range and whether a resume may change it are declared on the field
(:func:`~keras_dl.config.bounds.setting`). Nothing here parses or checks a value:
:mod:`keras_dl.config.parse` reads YAML files and ``--set`` overrides into these types,
:mod:`keras_dl.config.validate` checks them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from keras_dl.config.bounds import setting

# A setting with a fixed set of values is typed Literal[...]: that type is the one list of its
# choices (keras_dl.config.choices checks every such field, and no check repeats the list).
Strategy = Literal["auto", "none", "mirrored", "horovod", "multiworker"]
STRATEGIES = get_args(Strategy)

# Keys of the ``model`` section that every recipe has, kept on Experiment itself rather than in
# each recipe's own model dataclass: ``--set model.init_from=models:/digits@champion``.
SHARED_MODEL_KEYS = ("init_from",)


@dataclass(frozen=True)
class SourceConfig:
    """One source of a mixed training split (``data.sources``).

    Args:
        name: The source's name: ``rows_trained/<name>``, its MLflow dataset input and its
            test metrics (``test_<name>_...``) carry it. Letters, digits, ``_`` and ``-``.
        table: Its table, any format ``data.table`` takes.
        weight: Its share of each epoch's rows, relative to the other sources' (>= 0).
        version: Its Delta version. Defaults to the latest.
        since_version: Only the rows added after this Delta version. Defaults to None.
        filters: Its own row filters (as ``data.filters``), applied with ``data.filters``.
            Defaults to ().
    """

    name: str = ""
    table: str = ""
    weight: float = 1.0
    version: int | None = None
    since_version: int | None = None
    filters: tuple[str, ...] = ()


@dataclass(frozen=True)
class DataConfig:
    """Where the training data lives and how it is read.

    Args:
        table: Delta table, Parquet directory, glob or comma-separated file list, or an MDS
            folder (Mosaic StreamingDataset: an index.json at its root).
        version: Delta version to read (time travel). Defaults to the latest.
        timestamp: Delta timestamp (ISO 8601) to read instead of a version. Defaults to None.
        since_version: Read only the rows added after this Delta version and still in the table
            at ``version`` (appends, and inserts and update post-images from the change data
            feed; see ``keras_dl.data.tables.changes``). Defaults to None (the whole table).
        since_timestamp: As ``since_version``, from the latest version committed at or before
            this ISO 8601 time. Defaults to None.
        label: Label column, or several (a list, e.g. ``--set data.label=price,churned``):
            the model then gets one output head per label, each with its own loss and
            metrics, and scores one column per head. Defaults to "label".
        weight_column: A numeric column of per-row sample weights (finite, >= 0), used by
            training and by the validation and test metrics (weighted), never a model input.
            Defaults to None (every row weighs 1).
        features: Feature columns; empty means every column but the label and split column.
        pack_features: Read the scalar numeric features of each dtype (two or more columns) as
            one ``(rows, k)`` tensor named ``__packed_<dtype>`` (one array through the reader,
            the cache and tf.data instead of k); the logged model still takes named columns.
            For models that take that tensor (the tabular recipe turns it on). Defaults to
            False.
        split_column: Column that holds "train"/"validation"/"test". Defaults to None (no splits).
        train_split: Value of ``split_column`` for training rows. Defaults to "train".
        validation_table: Separate validation table. Defaults to None (use ``validation_split``).
        validation_split: Value of ``split_column`` for validation rows; empty for none.
        test_table: Separate test table. Defaults to None (use ``test_split``).
        test_split: Value of ``split_column`` for test rows; empty for none.
        workers: Petastorm reader worker threads (they decode). Defaults to 2.
        io_concurrency: Range requests in flight at once when the table is on an object store
            (S3): each reader fetches its row groups' planned column chunks ahead of its
            workers, in the planned order, in coalesced requests, on I/O threads that wait on
            the network without holding the interpreter. 0 turns that off (each worker opens
            the file and reads its row group itself, one request after another). Defaults to 16.
        io_max_bytes: Bytes a reader has requested and not yet decoded, at most (one larger
            row group is still fetched, alone). Defaults to 67108864 (64 MiB).
        shuffle: Shuffle row groups and rows (seeded). Defaults to True.
        shuffle_buffer: Rows mixed in memory when shuffling. Defaults to 4096.
        seed: Seed for row-group order and the shuffle buffer. Defaults to 42.
        deterministic: Reproducible row order run after run: the seeded shuffle with one reader
            thread (slower). Defaults to False.
        filters: Row filters "COLUMN OP VALUE" (OP one of = != < <= > >= in, "in" values
            separated by "|"), e.g. ("year >= 2020", "country in US|FR"). Filters on partition
            columns skip whole files. Defaults to ().
        lineage_columns: Columns whose values for the rows each split read are kept in the
            run's training manifest (zstd Parquet), e.g. ("customer_id",), so ``keras-dl
            lineage --where`` can still answer on them after VACUUM removed the trained
            files (see docs/lineage.md). Defaults to () (the answer then needs the trained
            version to be readable).
        cache_dir: Copy the table's files to this local folder once and read them from there
            (for remote or slow storage): copied in the background while the first epoch
            streams from the store, read from the folder by the epochs after. The folder is a
            cache shared by the processes and runs of the host, keyed by each file's URI, size
            and modification time (see docs/storage.md#the-local-disk-cache). Defaults to None
            (read in place).
        cache_dir_max_bytes: Bytes of files ``cache_dir`` holds at most: the least recently
            used entries no process on the host is reading are evicted to make room, and a
            file that still does not fit is read in place. Needs ``cache_dir``. Defaults to
            None (no bound).
        cache: "auto" keeps a split's decoded rows in memory after its first epoch when they
            fit ``cache_max_bytes`` (later epochs skip the reader; rows stay exactly once per
            epoch and reshuffled), "never" reads every epoch from the table. Defaults to "auto".
        cache_max_bytes: Memory budget per split (and per process) for ``cache``. Defaults to
            268435456 (256 MiB).
        image_size: (height, width) for image recipes; empty keeps the recipe's. Defaults to ().
        on_bad_image: "fail" on an undecodable image, or "skip" it and count it (logged to
            MLflow as data.bad_images_skipped). Defaults to "fail".
        sources: Train on several tables mixed by weight instead of ``data.table`` alone: a
            list of :class:`SourceConfig` (``name``, ``table`` in any format ``data.table``
            takes, ``weight``: its share of each epoch, relative to the others', >= 0, and each
            its own ``version``, ``since_version`` and ``filters``). In YAML a list of mappings
            (or a mapping of name to source); with ``--set``, the same list in YAML's flow
            style, e.g. ``--set 'data.sources=[{name: old, table: t1, weight: 0.7}, {name: new,
            table: t2, weight: 0.3}]'``. Each epoch holds each source's share of
            ``data.epoch_rows`` exactly (largest remainder), each source's rows drawn without
            replacement (a smaller source repeats as whole passes, then a remainder),
            interleaved by the seeded shuffle; logged as ``rows_trained/<name>``. Errors name
            the source (``data.sources[0] ('old').weight=...``). ``data.table``, when set, is
            then only the evaluation splits' table. Defaults to () (``data.table`` alone).
        epoch_rows: Rows per epoch of a mixed training split (``data.sources`` or
            ``data.replay``). Defaults to None: every source's rows together (with
            ``data.replay``: the new rows' count divided by ``1 - replay``, so each new row
            trains once an epoch).
        replay: With ``data.since_version``: this share of each epoch's rows comes from the
            rows of the table at ``since_version`` (sampled anew each epoch), the rest from the
            rows added since: a two-source mix ("replay" and "new") of ``data.table``, e.g.
            ``--set data.replay=0.3``. Defaults to None (the new
            rows alone).
        trust_petastorm_metadata: Load a Petastorm dataset's Unischema with Petastorm's own
            unpickler, which runs whatever code the pickle in ``_common_metadata`` names. Only
            for tables whose writer you trust. Defaults to False: only Petastorm's, numpy's and
            Spark's data classes are unpickled, anything else is refused with an error.
    """

    table: str = ""
    version: int | None = None
    timestamp: str | None = None
    since_version: int | None = None
    since_timestamp: str | None = None
    label: str | tuple[str, ...] = "label"
    weight_column: str | None = None
    features: tuple[str, ...] = ()
    pack_features: bool = False
    split_column: str | None = None
    train_split: str = "train"
    validation_table: str | None = None
    validation_split: str = "validation"
    test_table: str | None = None
    test_split: str = "test"
    workers: int = setting(2, 1, free_on_resume=True)
    io_concurrency: int = setting(16, 0, free_on_resume=True)
    io_max_bytes: int = setting(64 << 20, 1, free_on_resume=True)
    shuffle: bool = True
    shuffle_buffer: int = setting(4096, 1)
    seed: int = 42
    deterministic: bool = False
    filters: tuple[str, ...] = ()
    lineage_columns: tuple[str, ...] = ()
    cache_dir: str | None = setting(None, free_on_resume=True)
    cache_dir_max_bytes: int | None = setting(None, 1, free_on_resume=True)
    cache: Literal["auto", "never"] = "auto"
    cache_max_bytes: int = setting(256 << 20, 0)
    image_size: tuple[int, ...] = ()
    on_bad_image: Literal["fail", "skip"] = "fail"
    trust_petastorm_metadata: bool = False
    sources: tuple[SourceConfig, ...] = ()
    epoch_rows: int | None = setting(None, 1, example=10000)
    replay: float | None = setting(None, 0, 1, low_open=True, high_open=True, example=0.3)

    @property
    def labels(self) -> tuple[str, ...]:
        """The label columns, one per output head: ``label`` as a tuple (empty for none)."""
        if isinstance(self.label, str):
            return (self.label,) if self.label else ()
        return tuple(self.label)


@dataclass(frozen=True)
class TrainConfig:
    """How the model is fit.

    ``epochs`` and ``batch_size`` may be null (None) only in a recipe whose own default is null:
    that recipe chooses them from the training table before training (see
    :func:`keras_dl.recipe.configure`; the tabular recipe does). Elsewhere null is refused.

    Args:
        epochs: Passes over the training split. Defaults to 10.
        batch_size: Global batch size (all replicas together). Defaults to 32.
        learning_rate: Base learning rate, before any world-size scaling. Defaults to 1e-3.
        optimizer: A Keras optimizer name ("adam", "sgd", "rmsprop", "adamw"). Defaults to "adam".
        lr_schedule: "constant" or "cosine" (decay to 0 over all epochs). Defaults to "constant".
        mixed_precision: Use the "mixed_float16" policy. Defaults to False.
        seed: Seed for weights initialisation and dropout. Defaults to 42.
        verbose: Keras ``fit`` verbosity on the chief (0, 1 or 2). Defaults to 2.
        class_weight: "balanced" (each class weighs n_rows / (n_classes * its rows), from the
            training split's label counts) or "LABEL:WEIGHT" pairs, e.g. ("0:1", "1:5"); a
            YAML mapping works too. Unlisted labels weigh 1. Multiplied with
            ``data.weight_column`` when both are set. Defaults to () (no class weights).
    """

    epochs: int | None = setting(10, 1, free_on_resume=True, chosen_by_recipe=True)
    batch_size: int | None = setting(32, 1, chosen_by_recipe=True)
    learning_rate: float = setting(1e-3, 0, low_open=True)
    optimizer: str = "adam"
    lr_schedule: Literal["constant", "cosine"] = "constant"
    mixed_precision: bool = False
    seed: int = 42
    verbose: int = setting(2, free_on_resume=True)
    class_weight: tuple[str, ...] = ()


@dataclass(frozen=True)
class RuntimeConfig:
    """Where and how the training runs.

    Args:
        strategy: "auto", "none", "mirrored", "horovod" or "multiworker" (TF's
            MultiWorkerMirroredStrategy, one worker per process, ``np`` of them; see
            docs/distributed.md). Defaults to "auto".
        np: Horovod ranks or multi-worker processes: < 0 runs -np on this host, > 0 runs np
            Spark tasks (one rank or worker per task). Defaults to 0.
        run_dir: Folder for the resolved config and checkpoints: a local path, an ``s3://`` or
            an ``abfss://`` URI (checkpoints counted by manifests, the run lock a lease; see
            :mod:`keras_dl.checkpoints.protocol`). Defaults to "runs/<recipe>".
        resume: Resume from the last checkpoint in ``run_dir``. Defaults to True.
        lr_scaling: "none" or "linear": multiply the learning rate by the number of replicas.
            ``train.batch_size`` is global, so "none" keeps the optimization the same on any
            world size; use "linear" when you grow the batch with the world. Defaults to "none".
        warmup_epochs: Epochs over which the learning rate ramps up to its (scaled) value.
            Defaults to 0.
        fp16_allreduce: Horovod: send gradients as float16 (half the bytes). Defaults to False.
        start_timeout: Horovod and multiworker: seconds to wait for all processes or Spark
            tasks to start before failing (a waiting barrier stage is cancelled; on Spark
            Connect too for Horovod). Defaults to 120.
        max_restarts: Horovod: relaunch the job from its newest checkpoint, in the same MLflow
            run, when a rank dies or is preempted, up to this many times. Python errors are
            never retried. Defaults to 0 (as TF Model Garden's ``recovery_max_trials``).
        stall_timeout: Horovod: a rank that waits longer than this many seconds for the others
            in a collective (an allreduce, a broadcast) ends the job, naming the ranks that did
            not join and the collective. Defaults to 120.
        bind_address: Address the servers keras_dl starts listen on: Horovod's rendezvous,
            driver and task services for ``np < 0``, and the Spark driver on a local master.
            Widen it (e.g. "0.0.0.0") only on a trusted network: these services accept
            pickles. With ``np > 0`` Spark executors must reach the driver, so there it is used
            only when set. Defaults to "127.0.0.1".
        spark_ui: Start the Spark web UI in Spark sessions keras_dl creates. Defaults to False.
        lease_seconds: With ``run_dir`` on S3 or Azure: how long the run's lease (its lock)
            lasts unless renewed (Azure's blob leases: 15 to 60 s); the training renews it every
            third of that, and a run whose holder died can start once it lapses. Store calls are retried through an outage until the
            lease lapses; then the run stops with exit 75 (rerun to resume). Defaults to 60.
        profile_steps: ``START,END``: rank 0 traces training steps START to END (from 1, in
            each ``fit``) with TensorFlow's profiler; the trace goes to the run with the
            TensorBoard logs (it turns those on). Defaults to () (no trace).
        check_shared_storage: With ``np > 0``: before training, check that every host of the
            Spark cluster sees the local folders rank 0 writes to (``run_dir``, a SQLite or file
            ``tracking.uri``, a local artifact root) as this one does, and refuse them by name
            otherwise (:mod:`keras_dl.launch.shared_storage`; see
            docs/distributed.md#local-ranks-spark-tasks-and-shared-folders-checked-before-training).
            Set it to False only where the
            check's Spark stage cannot run and the folders are known to be shared.
            Defaults to True.
    """

    strategy: Strategy = "auto"
    np: int = 0
    run_dir: str = ""
    resume: bool = True
    lr_scaling: Literal["none", "linear"] = "none"
    warmup_epochs: float = setting(0.0, 0)
    fp16_allreduce: bool = False
    start_timeout: int = setting(120, 1)
    max_restarts: int = setting(0, 0)
    stall_timeout: int = setting(120, 1)
    bind_address: str = "127.0.0.1"
    spark_ui: bool = False
    lease_seconds: float = setting(60.0, 1)
    profile_steps: tuple[int, ...] = ()
    check_shared_storage: bool = True

    @property
    def launches(self) -> bool:
        """True when training runs in processes keras_dl launches: ``abs(np)`` Horovod ranks or
        multi-worker workers (``np < 0`` on this host, ``np > 0`` as Spark tasks)."""
        return self.strategy in ("horovod", "multiworker") and self.np != 0


@dataclass(frozen=True)
class TrackingConfig:
    """MLflow tracking.

    Args:
        uri: Tracking URI. Defaults to a SQLite file ``mlflow.db`` in the working directory.
        experiment: MLflow experiment name. Defaults to the recipe name.
        registered_model: Registry name for the trained model. Defaults to the recipe name;
            set it to "none" to skip registration.
        log_model: Log the trained model with its signature. Defaults to True.
        artifact_location: Where a new MLflow experiment keeps its artifacts (the model,
            plots), e.g. ``s3://bucket/mlflow`` or
            ``wasbs://container@account.blob.core.windows.net/mlflow``; credentials and endpoint
            come from the standard AWS environment, or for Azure from
            ``AZURE_STORAGE_CONNECTION_STRING`` (or ``AZURE_STORAGE_ACCESS_KEY``) as MLflow
            reads them. An existing experiment with another location is an
            error. Defaults to "" (MLflow's default; ``mlartifacts/`` beside a SQLite store).
        system_metrics_seconds: Every rank samples its CPU %, resident memory, bytes read and
            written, and GPU use and memory (when ``nvidia-ml-py`` is installed and finds a
            GPU) this often, and once when training starts and ends, logged in the run as
            ``system/rank_<r>/<name>``; 0 turns it off, otherwise at least 0.1. Defaults to 10.
        tensorboard: Rank 0 writes TensorBoard logs, uploaded to the run's
            ``tensorboard_logs/`` at the end (one writer, also beside
            ``mlflow.tensorflow.autolog``). Defaults to False.
        prometheus_port: The run's live figures in Prometheus' text format at ``/metrics`` on
            this port while it trains, served by the training process (a Horovod job: the
            launcher's process, fed by rank 0; rank 0 itself on Spark Connect); 0 picks a free
            port and prints it (docs/monitoring.md). Defaults to None (off).
        prometheus_bind: The IPv4 address ``/metrics`` listens on; 0.0.0.0 for every
            interface. Defaults to "127.0.0.1" (this host only).
        prometheus_pushgateway: A Pushgateway URL (``http://host:9091``): rank 0 pushes the
            figures, one group per rank, at each epoch end and at the end of training.
            Defaults to "" (no push).
        prometheus_final_scrape_seconds: At the end of training, keep ``/metrics`` up until it
            is scraped once more, at most this long, so the final values reach Prometheus.
            Defaults to 0.
    """

    uri: str = ""
    experiment: str = ""
    registered_model: str = ""
    log_model: bool = True
    artifact_location: str = ""
    system_metrics_seconds: float = 10.0
    tensorboard: bool = False
    prometheus_port: int | None = None
    prometheus_bind: str = "127.0.0.1"
    prometheus_pushgateway: str = ""
    prometheus_final_scrape_seconds: float = 0.0


@dataclass(frozen=True)
class CallbacksConfig:
    """The default callbacks: early stopping, checkpoints, throughput, plots.

    Args:
        monitor: Metric early stopping watches. Defaults to "val_loss".
        mode: "min", "max" or "auto" (max for accuracy-like names). Defaults to "auto".
        min_delta: Smallest change that counts as an improvement. Defaults to 0.0.
        patience: Epochs without improvement before stopping; None never stops on patience.
            Defaults to None.
        stopping_threshold: Stop as soon as ``monitor`` is better than this. Defaults to None.
        divergence_threshold: Stop as soon as ``monitor`` is worse than this. Defaults to None.
        check_finite: Stop on a NaN or infinite loss or monitored value. Defaults to True.
        divergence_factor: Stop, and fail the run as diverged, when an epoch's training loss
            is more than this many times the first epoch's; 0 disables it. Defaults to 10.0.
        trivial_loss_factor: Stop, and fail the run as diverged, when an epoch's training loss
            is more than this many times the trivial predictor's loss on the training rows
            (the class frequencies' cross-entropy, or the mean's MSE/MAE; see
            :mod:`keras_dl.trivial`); 0 disables it. Defaults to 100.0.
        restore_best_weights: Restore the best epoch's weights when stopping early.
            Defaults to False.
        checkpoint_every_n_steps: Also checkpoint every N steps (0: each epoch only).
            Defaults to 0.
        keep_checkpoints: Checkpoints kept in ``runtime.run_dir``/checkpoints. Defaults to 3.
        log_every_n_steps: Also log step metrics and throughput every N steps (0: per epoch
            only). Defaults to 0.
        plots: Log loss/metric curves (and a confusion matrix for classifiers) as PNG
            artifacts at the end. Defaults to True.
    """

    monitor: str = "val_loss"
    mode: Literal["auto", "min", "max"] = "auto"
    min_delta: float = setting(0.0, 0)
    patience: int | None = setting(None, 0)
    stopping_threshold: float | None = None
    divergence_threshold: float | None = None
    check_finite: bool = True
    divergence_factor: float = 10.0
    trivial_loss_factor: float = 100.0
    restore_best_weights: bool = False
    checkpoint_every_n_steps: int = setting(0, 0)
    keep_checkpoints: int = setting(3, 1)
    log_every_n_steps: int = setting(0, 0)
    plots: bool = True


@dataclass(frozen=True)
class RegistryConfig:
    """What a trained model must show before it is registered (see :mod:`keras_dl.model.gate`).

    Whatever is set here, a model is registered only when its evaluation metric beats the
    trivial predictor on the same rows (the training majority class, or the training mean).

    Args:
        min_metric: A floor "NAME OP NUMBER" on an evaluation metric, OP one of >=, >, <=, <,
            e.g. "test_accuracy>=0.95". Defaults to "" (none).
        must_beat: An alias of the registered model, e.g. "champion": the new model must beat
            the version holding it on the same evaluation rows (passes when no version holds
            it yet). Defaults to "" (none).
        set_alias: An alias moved to the new version once it is registered, e.g. "champion".
            Defaults to "" (none).
        forgetting_tolerance: With ``must_beat`` and ``data.since_version`` (or
            ``data.since_timestamp``), the new model is evaluated on the changed rows and on
            the whole test split at the new version; there it may be worse than the champion
            by at most this share of the champion's figure (0.01: accuracy 0.90 allows 0.891,
            MSE 2.0 allows 2.02), so a model that forgot the older rows is refused. Defaults
            to 0.01.
    """

    min_metric: str = ""
    must_beat: str = ""
    set_alias: str = ""
    forgetting_tolerance: float = setting(0.01, 0, 1, high_open=True)


@dataclass(frozen=True)
class TuneConfig:
    """Hyperparameter search (``keras-dl tune``; see :mod:`keras_dl.tune`).

    Args:
        trials: Trials the study runs in all, counting the completed and pruned trials of
            earlier (interrupted) runs of the same study. Defaults to 20.
        parallelism: Trials run at a time, as Spark tasks when more than 1. Defaults to 1.
        metric: The per-epoch validation metric a trial is scored and pruned on. Defaults to
            "" (``callbacks.monitor``).
        direction: "minimize", "maximize" or "auto" (maximize for accuracy-like names).
            Defaults to "auto".
        pruning: Stop unpromising trials early (Optuna's median pruner on ``metric``).
            Defaults to True.
        study: The Optuna study's name. Defaults to "" (the recipe name).
        storage: The study's journal file (resumable after a kill). Defaults to "" (beside the
            MLflow store: ``optuna-<study>.journal`` next to a SQLite file, else in
            ``runtime.run_dir``).
        seed: Seed of the TPE sampler. Defaults to 42.
    """

    trials: int = setting(20, 1)
    parallelism: int = setting(1, 1)
    metric: str = ""
    direction: Literal["auto", "minimize", "maximize"] = "auto"
    pruning: bool = True
    study: str = ""
    storage: str = ""
    seed: int = 42


@dataclass(frozen=True)
class Experiment:
    """One training run: a recipe name plus its config sections and the recipe's model config.

    ``model`` is a frozen dataclass defined by the recipe (or None); ``--set model.KEY=VALUE``
    overrides it like any other section.

    ``init_from`` is the one key every recipe's ``model`` section has (``model.init_from``,
    see :data:`SHARED_MODEL_KEYS`): a registered model, ``models:/NAME@ALIAS`` or
    ``models:/NAME/VERSION``, whose weights the freshly built model starts from (a warm
    start; a resumed checkpoint wins over it). It lives here, not in each recipe's dataclass;
    :mod:`keras_dl.config.parse` and :mod:`keras_dl.config.dump` read and write it as
    ``model.init_from``. Defaults to "" (random initialisation).
    """

    recipe: str = ""
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    callbacks: CallbacksConfig = field(default_factory=CallbacksConfig)
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    model: Any = None
    init_from: str = ""

    def sections(self) -> dict[str, Any]:
        """The config sections by name, the recipe's ``model`` section included when present."""
        names = ("data", "train", "runtime", "tracking", "callbacks", "registry", "tune")
        out = {s: getattr(self, s) for s in names}
        if self.model is not None:
            out["model"] = self.model
        return out
