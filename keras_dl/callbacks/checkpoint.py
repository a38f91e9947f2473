"""Checkpoint: atomic checkpoints each epoch (and every N steps) and resume after a crash.

A checkpoint is one ``.npz`` file holding every model variable (dropout seed states included),
every optimizer variable (its step counter included), the NumPy and Python RNG states, and a
JSON header with the epoch, step and MLflow run id. It is written to a temporary name, flushed
to disk, then renamed with ``os.replace``: a kill at any moment leaves either the previous
checkpoint or the new one, never a half-written "latest". On resume, files that do not load are
skipped with a warning and the newest one that does is used. The directory may be an
object-store URI (``s3://bucket/run/checkpoints``): there each checkpoint is uploaded and then
made to count by a manifest written last (see :mod:`keras_dl.callbacks.remote_checkpoints`).

The training position is the optimizer's step counter: resuming sets ``fit``'s start epoch from
it, and a checkpoint taken mid-epoch finishes that epoch with only the steps it still lacked.

Example:
    >>> ckpt = Checkpoint("runs/my-model/checkpoints", keep=3)       # doctest: +SKIP
    >>> model.fit(ds, epochs=10, steps_per_epoch=100, callbacks=[ckpt])  # doctest: +SKIP
    >>> # killed? run the same code again: it resumes where the last checkpoint left off.
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import re
import tempfile
import time
from pathlib import Path

import keras
import numpy as np

from keras_dl import storage
from keras_dl.callbacks import remote_checkpoints as remote
from keras_dl.distribute.world import current_world

log = logging.getLogger(__name__)

_NAME = re.compile(r"^ckpt-(\d{9})\.npz$")
COMPLETE = "COMPLETE"  # marker: the training is over, nothing to resume
FINISHING = "FINISHING.json"  # the post-training steps done so far (see keras_dl.finish)


class Checkpoint(keras.callbacks.Callback):
    """Write resumable checkpoints on rank 0, keep the last ``keep``, resume from the newest.

    Put it first in the callbacks list: when a mid-epoch checkpoint is resumed, it ends that
    epoch early by setting ``model.stop_training`` and clears the flag again in its own
    ``on_epoch_end``, before callbacks that may set it for their own reasons.

    Args:
        directory: Folder of the checkpoint files (created on rank 0): a local path or an
            object-store URI.
        every_n_steps: Also checkpoint every N training steps (0: at each epoch end only).
            Defaults to 0.
        keep: Checkpoints kept; older ones are deleted. Defaults to 3.
        resume: Restore the newest valid checkpoint at the start of training; when False, old
            checkpoints in ``directory`` are deleted and training starts fresh. Defaults to True.
        metadata: Extra JSON-serialisable values stored in every checkpoint header (for
            example the MLflow run id). A ``"config"`` value is a fingerprint: checkpoints
            whose header holds another one are not resumed. Defaults to None.
        mark_complete: Mark the directory complete when ``fit`` returns. A caller with more
            to do after ``fit`` (evaluation, model logging) passes False, calls
            :meth:`save_final` and marks it with :func:`mark_complete` once all is done.
            Defaults to True.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        every_n_steps: int = 0,
        keep: int = 3,
        resume: bool = True,
        metadata: dict | None = None,
        mark_complete: bool = True,
    ):
        super().__init__()
        if keep < 1:
            raise ValueError(f"Checkpoint keep must be >= 1, got {keep}.")
        self.directory = _directory(directory)
        self.every_n_steps = every_n_steps
        self.keep = keep
        self.resume = resume
        self.metadata = dict(metadata or {})
        self.mark_complete = mark_complete
        self.restored: dict | None = None  # the header of the checkpoint restored, if any
        self._restore_done = False

    # -- public ------------------------------------------------------------------------------
    def restore(self) -> int:
        """Load the newest valid checkpoint into the model (rank 0 only).

        Call it after ``compile`` and before ``fit`` when the restored state must be broadcast
        to other ranks before training (Horovod); otherwise ``on_train_begin`` calls it.

        Returns:
            The global step restored (0 when there is no checkpoint or on other ranks).
        """
        self._restore_done = True
        if not current_world().is_chief:
            return 0
        if not self.resume or is_complete(self.directory):
            if self.resume:
                print(f"The training in {self.directory} finished; starting a new one.")
            self._clear()
            return 0
        for tmp in _temporaries(self.directory):  # left by a writer killed mid-write
            tmp.unlink(missing_ok=True)
        if remote.is_remote(self.directory):  # uploads without a manifest, older than the newest
            remote.prune(str(self.directory), self.keep)
        wanted = self.metadata.get("config")
        for path in reversed(list_checkpoints(self.directory)):
            try:
                if wanted is not None and read_header(path).get("config", wanted) != wanted:
                    print(
                        f"The checkpoints in {self.directory} were written with another "
                        "configuration; starting a new training."
                    )
                    break
                header = load_checkpoint(path, self.model)
            except Exception as exc:  # a partial or corrupt file: fall back to an older one
                log.warning("Skipping unreadable checkpoint %s (%s).", path, exc)
                continue
            self.restored = header
            print(
                f"Resuming from checkpoint {_name(path)}: {header['epoch']} epoch(s) and "
                f"{header['step']} step(s) done (global step {header['global_step']})."
            )
            return int(header["global_step"])
        self._set_aside()  # nothing resumable: old files must not mix with the new training's
        return 0

    @property
    def global_step(self) -> int:
        """Training steps completed (as of the last ``fit``)."""
        return getattr(self, "_global_step", 0)

    def save_now(self) -> None:
        """Checkpoint the current position now, even mid-epoch (rank 0 writes).

        Called between steps (after a step's ``on_train_batch_end``), for example by
        :class:`~keras_dl.callbacks.preemption.Preemption` on SIGTERM.
        """
        self._save()

    def save_final(self) -> None:
        """Checkpoint the weights as training left them, marked ``training_done``.

        Resuming it trains no further epochs: a failure after ``fit`` (evaluation, model
        logging) then costs no training when the same command is run again.
        """
        self._save(training_done=True)

    # -- Keras hooks -------------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        world = current_world()
        self._chief = world.is_chief
        self._truncate_after: int | None = None
        self._steps_this_epoch = 0
        if not self._restore_done:
            self.restore()
        self._restore_done = False  # the next fit call restores (or not) again
        self._last_epoch = (self.restored or {}).get("last_epoch")
        self._steps = self.params.get("steps") or 0
        # The position is the optimizer's step counter as restored (on rank 0 only).
        self._global_step = (
            int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) if self.restored else 0
        )
        done = int(bool((self.restored or {}).get("training_done")))
        if world.size > 1 and self.resume:
            self._global_step, done = broadcast_position(self._global_step, done)
        if done:  # trained to the end before: fit runs no epoch, whatever the step says
            self.model._initial_epoch = self.params.get("epochs") or 0
        elif self._global_step and self._steps:
            epoch, step = divmod(self._global_step, self._steps)
            self.model._initial_epoch = epoch  # read by fit(); Keras' BackupAndRestore does too
            if step:
                self._truncate_after = self._steps - step  # finish the interrupted epoch only

    # Only a batch *begin* hook: it needs nothing from the step's logs, and on backends that
    # dispatch batch-end callbacks asynchronously (JAX), a batch-end hook would turn that off.
    def on_train_batch_begin(self, batch, logs=None):
        # ``_global_step`` counts the steps completed: every step begun before this one.
        if self._truncate_after is not None and self._steps_this_epoch + 1 >= self._truncate_after:
            self.model.stop_training = True  # this step ends the resumed epoch; cleared after
        at_epoch_end = self._steps and self._global_step % self._steps == 0  # saved there
        if (
            self.every_n_steps
            and self._global_step
            and self._global_step % self.every_n_steps == 0
            and not at_epoch_end
        ):
            self._save()
        self._global_step += 1
        self._steps_this_epoch += 1

    def on_epoch_begin(self, epoch, logs=None):
        self._steps_this_epoch = 0

    def on_epoch_end(self, epoch, logs=None):
        if self._truncate_after is not None:
            self._truncate_after = None
            self.model.stop_training = False
        bad = [k for k, v in (logs or {}).items() if "loss" in k and not _finite(v)]
        if bad:  # a checkpoint of diverged weights would only resume the divergence
            log.warning("Not checkpointing epoch %d: %s not finite.", epoch + 1, ", ".join(bad))
            return
        # Kept in the header: a kill between this save and the loggers' send of the epoch's
        # metrics would otherwise leave that epoch missing from the resumed run's history.
        numbers = {k: float(v) for k, v in (logs or {}).items() if _finite(v) and _number(v)}
        self._last_epoch = {"epoch": epoch, "logs": numbers}
        self._save()

    def on_train_end(self, logs=None):
        self.model._initial_epoch = None  # a later fit call starts where the caller says
        self.restored = None
        if self.mark_complete and self._chief and _is_dir(self.directory):
            # fit returned normally: the next run in this directory starts fresh, not "resumes"
            mark_complete(self.directory, self._global_step)

    # -- internals ---------------------------------------------------------------------------
    def _save(self, **extra) -> None:
        if not getattr(self, "_chief", False):
            return
        steps = self._steps or 1
        epoch, step = divmod(self._global_step, steps)
        header = {
            **self.metadata,
            "epoch": epoch,
            "step": step,
            "global_step": self._global_step,
            "steps_per_epoch": self._steps,
            "time": time.time(),
            "last_epoch": self._last_epoch,
            **extra,
        }
        name = f"ckpt-{self._global_step:09d}.npz"
        if remote.is_remote(self.directory):
            save_checkpoint(storage.join(self.directory, name), self.model, header)
            remote.prune(self.directory, self.keep)
            return
        save_checkpoint(self.directory / name, self.model, header)
        for old in list_checkpoints(self.directory)[: -self.keep]:
            old.unlink(missing_ok=True)

    def _set_aside(self) -> None:
        """Move checkpoints that cannot be resumed to ``directory/previous/`` (kept, not lost)."""
        if remote.is_remote(self.directory):
            storage.remove(storage.join(self.directory, FINISHING))
            moved = remote.set_aside(self.directory)
            if moved:
                print(
                    f"Moved {moved} checkpoint(s) that cannot be resumed to {self.directory}/previous."
                )
            return
        (self.directory / FINISHING).unlink(missing_ok=True)  # it belonged to those checkpoints
        old = list_checkpoints(self.directory)
        if not old:
            return
        aside = self.directory / "previous"
        if aside.is_dir():
            for p in aside.iterdir():
                p.unlink()
        aside.mkdir(exist_ok=True)
        for p in old:
            os.replace(p, aside / p.name)
        print(f"Moved {len(old)} checkpoint(s) that cannot be resumed to {aside}.")

    def _clear(self) -> None:
        if remote.is_remote(self.directory):
            remote.remove_all(self.directory, COMPLETE, FINISHING)
            return
        for path in list_checkpoints(self.directory) + _temporaries(self.directory):
            path.unlink(missing_ok=True)
        (self.directory / COMPLETE).unlink(missing_ok=True)
        (self.directory / FINISHING).unlink(missing_ok=True)


def save_checkpoint(path: str | os.PathLike, model, header: dict) -> Path | str:
    """Write ``model``'s variables, its optimizer's and the RNG states to ``path`` atomically.

    For an object-store URI the file is written to a local temporary folder, uploaded, and
    then its manifest is written (:func:`~keras_dl.callbacks.remote_checkpoints.publish`).
    """
    if remote.is_remote(path):
        folder, name = str(path).rsplit("/", 1)
        with tempfile.TemporaryDirectory(prefix="keras_dl-ckpt-") as tmp:
            return remote.publish(save_checkpoint(Path(tmp) / name, model, header), folder)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"model/{i}": np.asarray(v.numpy()) for i, v in enumerate(model.variables)}
    if model.optimizer is not None:
        for i, v in enumerate(model.optimizer.variables):
            arrays[f"optimizer/{i}"] = np.asarray(v.numpy())
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    arrays["rng/numpy_keys"] = keys
    header = {**header, "numpy_rng": [name, int(pos), int(has_gauss), float(gauss)]}
    version, internal, gauss_next = random.getstate()
    arrays["rng/python"] = np.asarray(internal, dtype=np.int64)
    header["python_rng"] = [version, gauss_next]
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())  # the rename must never publish data still in the page cache
    os.replace(tmp, path)
    _fsync_dir(path.parent)  # and the rename itself must survive a power loss
    return path


def load_checkpoint(path: str | os.PathLike, model) -> dict:
    """Restore a checkpoint written by :func:`save_checkpoint` into ``model``; return its header.

    Raises:
        ValueError: When the file's variables do not match the model's (another architecture).
        OSError, zipfile.BadZipFile: When the file is partial or corrupt.
    """
    with np.load(_source(path), allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}  # reads (and CRC-checks) every member
    header = json.loads(arrays.pop("header").tobytes().decode())
    model_vars = list(model.variables)
    saved_model = [k for k in arrays if k.startswith("model/")]
    if len(saved_model) != len(model_vars):
        raise ValueError(
            f"{path} holds {len(saved_model)} model variables but the model has {len(model_vars)}."
        )
    optimizer = model.optimizer
    saved_opt = [k for k in arrays if k.startswith("optimizer/")]
    if saved_opt and optimizer is not None and not optimizer.built:
        strategy = getattr(model, "distribute_strategy", None)
        if strategy is not None:
            with strategy.scope():
                optimizer.build(model.trainable_variables)
        else:
            optimizer.build(model.trainable_variables)
    targets = [(f"model/{i}", v) for i, v in enumerate(model_vars)]
    if optimizer is not None:
        opt_vars = list(optimizer.variables)
        if len(saved_opt) != len(opt_vars):
            raise ValueError(
                f"{path} holds {len(saved_opt)} optimizer variables but the optimizer has "
                f"{len(opt_vars)}: was it written with another optimizer?"
            )
        targets += [(f"optimizer/{i}", v) for i, v in enumerate(opt_vars)]
    for key, var in targets:  # check every shape before assigning any
        if tuple(arrays[key].shape) != tuple(var.shape):
            raise ValueError(f"{path}: {key} has shape {arrays[key].shape}, expected {var.shape}.")
    for key, var in targets:
        var.assign(arrays[key])
    name, pos, has_gauss, gauss = header["numpy_rng"]
    np.random.set_state((name, arrays["rng/numpy_keys"], pos, has_gauss, gauss))
    version, gauss_next = header["python_rng"]
    random.setstate((version, tuple(int(i) for i in arrays["rng/python"]), gauss_next))
    return header


def list_checkpoints(directory: str | os.PathLike) -> list[Path] | list[str]:
    """Complete checkpoint files in ``directory``, oldest first (temporaries excluded); URIs of
    the checkpoints whose manifest matches, for an object-store directory."""
    if remote.is_remote(directory):
        return remote.list_valid(str(directory).rstrip("/"))
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if _NAME.match(p.name))


def mark_complete(directory: str | os.PathLike, global_step: int) -> None:
    """Mark ``directory``'s training complete: the next run there starts fresh.

    Written to a temporary name, fsynced and renamed, then the directory itself is fsynced, so
    after a crash the marker is either fully there or absent (one PUT on an object store).
    """
    if remote.is_remote(directory):
        data = json.dumps({"global_step": int(global_step)}).encode()
        storage.write_atomic(storage.join(str(directory), COMPLETE), data)
        return
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{COMPLETE}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(json.dumps({"global_step": int(global_step)}))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, d / COMPLETE)
    _fsync_dir(d)


def is_complete(directory: str | os.PathLike) -> bool:
    """True when the training that wrote ``directory`` finished (fit returned)."""
    if remote.is_remote(directory):
        return remote.exists(storage.join(str(directory), COMPLETE))
    return (Path(directory) / COMPLETE).is_file()


def read_header(path: str | os.PathLike) -> dict:
    """The JSON header of a checkpoint file (epoch, step, global step, run id, ...)."""
    with np.load(_source(path), allow_pickle=False) as data:
        return json.loads(data["header"].tobytes().decode())


def _directory(directory: str | os.PathLike) -> Path | str:
    """A local folder (or ``file://`` URI) as a Path; an object-store URI as it is (without a
    trailing slash)."""
    if remote.is_remote(directory):
        return str(directory).rstrip("/")
    return Path(storage.local_path(str(directory)))


def _source(path: str | os.PathLike):
    """What ``np.load`` reads: the local file, or a remote file's bytes checked against its
    manifest."""
    return io.BytesIO(remote.read_verified(str(path))) if remote.is_remote(path) else path


def _name(path: str | os.PathLike) -> str:
    return str(path).rstrip("/").rsplit("/", 1)[-1]


def _is_dir(directory: Path | str) -> bool:
    return remote.any_files(directory) if remote.is_remote(directory) else directory.is_dir()


def _temporaries(directory: Path | str) -> list[Path]:
    if remote.is_remote(directory) or not directory.is_dir():
        return []
    return [p for p in directory.iterdir() if p.name.startswith(".ckpt-") and ".tmp-" in p.name]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _finite(value) -> bool:
    try:
        return bool(np.isfinite(float(value)))
    except (TypeError, ValueError):
        return True


def broadcast_position(step: int, done: int) -> tuple[int, int]:
    """Rank 0's global step and training-done flag on every rank (collective), so all ranks
    resume at one position.

    Only rank 0 reads checkpoints; the model and optimizer state follow with Horovod's
    ``BroadcastState`` callback, which runs after this one.
    """
    import tensorflow as tf

    from keras_dl.distribute import horovod as khvd

    var = tf.Variable([step, done], dtype=tf.int64, trainable=False)
    khvd.broadcast_variables([var], root_rank=0, prefix="checkpoint_step")
    step, done = (int(v) for v in var.numpy())
    return step, done


def _number(value) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, bool)
