"""The setups of a scaling study, parsed from ``--setups 1,mirrored:2,np:-2,np:2``.

- ``1``: one process on one device (``runtime.strategy=none``);
- ``mirrored:N``: one process, ``tf.distribute.MirroredStrategy`` over N devices (the first N
  GPUs, or N logical CPU devices on a host without GPUs);
- ``np:N``: Horovod with ``abs(N)`` ranks, as HorovodRunner's ``np``: ``N < 0`` runs local
  processes on this host, ``N > 0`` Spark tasks, which needs a Spark master;
- ``multiworker:N``: TF's MultiWorkerMirroredStrategy over N worker processes on this host
  (``runtime.strategy=multiworker``, ``runtime.np=-N``).

Every setup runs the experiment as resolved (the same recipe, epochs, global batch and
early-stopping thresholds); only ``runtime`` changes, and each gets its own run folder.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from keras_dl.config.schema import Experiment
from keras_dl.errors import ConfigError

FORMS = (
    "1, mirrored:N (N >= 1 devices), np:N (N < 0 local Horovod ranks, N > 0 Spark tasks) or "
    "multiworker:N (N >= 1 local multi-worker processes)"
)


@dataclass(frozen=True)
class Setup:
    """One cluster setup: ``kind`` is "single", "mirrored", "horovod" or "multiworker"; ``n``
    its count as written (Horovod's ``np``, negative for local ranks; the workers)."""

    kind: str
    n: int = 1

    @property
    def label(self) -> str:
        """As ``--setups`` writes it: "1", "mirrored:2", "np:-2"."""
        if self.kind == "multiworker":
            return f"multiworker:{self.n}"
        return {"single": "1", "mirrored": f"mirrored:{self.n}"}.get(self.kind, f"np:{self.n}")

    @property
    def key(self) -> str:
        """A name for run folders and metric keys: "single", "mirrored_2", "np_local_2"."""
        if self.kind == "single":
            return "single"
        if self.kind in ("mirrored", "multiworker"):
            return f"{self.kind}_{self.n}"
        return f"np_{'local' if self.n < 0 else 'spark'}_{abs(self.n)}"

    @property
    def replicas(self) -> int:
        """Model replicas training in sync (devices or ranks)."""
        return abs(self.n)

    @property
    def in_process(self) -> bool:
        """Trained by one process (the study starts it); Horovod and multi-worker setups start
        their processes (:func:`keras_dl.launch.launch`)."""
        return self.kind not in ("horovod", "multiworker")


def parse_setups(text: str) -> list[Setup]:
    """``"1,mirrored:2,np:-2"`` as setups, in order; a bad item raises a ConfigError naming it."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or not all(items):
        raise ConfigError(f"--setups {text!r} has an empty item. Give a comma list of {FORMS}.")
    setups = [parse_setup(item) for item in items]
    seen = set()
    for setup in setups:
        if setup.label in seen:
            raise ConfigError(
                f"--setups lists {setup.label!r} twice: each setup runs once. Drop the repeat."
            )
        seen.add(setup.label)
    return setups


def parse_setup(item: str) -> Setup:
    """One ``--setups`` item; a ConfigError naming it when it is none of the forms."""
    kind, _, count = item.partition(":")
    kind = kind.strip().lower()
    try:
        n = int(count) if count else None
    except ValueError:
        n = None
    if item == "1":
        return Setup("single")
    if kind == "mirrored" and n is not None and n >= 1:
        return Setup("mirrored", n)
    if kind == "np" and n:
        return Setup("horovod", n)
    if kind == "multiworker" and n is not None and n >= 1:
        return Setup("multiworker", n)
    raise ConfigError(f"--setups item {item!r} is not a setup: use {FORMS}.")


def setup_experiment(exp: Experiment, setup: Setup) -> Experiment:
    """``exp`` on ``setup``: its strategy and ``np``, its own run folder under
    ``<runtime.run_dir>/scaling/``, started afresh, and no registration (the study compares
    setups; it does not publish a model)."""
    strategy = {"single": "none", "mirrored": "mirrored"}.get(setup.kind, setup.kind)
    np = {"horovod": setup.n, "multiworker": -setup.n}.get(setup.kind, 0)
    runtime = dataclasses.replace(
        exp.runtime,
        strategy=strategy,
        np=np,
        run_dir=f"{exp.runtime.run_dir.rstrip('/')}/scaling/{setup.key}",
        resume=False,
    )
    tracking = dataclasses.replace(exp.tracking, registered_model="none")
    return dataclasses.replace(exp, runtime=runtime, tracking=tracking)


def spark_master(session) -> str | None:
    """What would run Spark tasks: the active ``session``, ``SPARK_REMOTE``, or the master
    ``MASTER`` or ``spark-defaults.conf`` names; None when nothing is configured."""
    from keras_dl.distribute.loopback import configured_master

    if session is not None:
        return "the active Spark session"
    return os.environ.get("SPARK_REMOTE") or configured_master()


def check_spark_master(setups: list[Setup], master: str | None) -> None:
    """Refuse ``np:N`` with ``N > 0`` when ``master`` (:func:`spark_master`) is None."""
    spark = [s for s in setups if s.kind == "horovod" and s.n > 0]
    if not spark or master:
        return
    raise ConfigError(
        f"--setups item {spark[0].label!r} runs {spark[0].n} Spark tasks, but no Spark master is "
        "configured. Set MASTER (e.g. MASTER=spark://host:7077, or MASTER=local[4] on this "
        "host), SPARK_REMOTE, or spark.master in $SPARK_CONF_DIR/spark-defaults.conf; or use "
        f"np:-{spark[0].n} for {spark[0].n} local ranks."
    )
