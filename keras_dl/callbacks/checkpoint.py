"""Checkpoint: checkpoints each epoch (and every N steps) and resume after a crash.

A Keras callback over :class:`keras_dl.checkpoints.Checkpoints`, which holds the files and
their protocol: a checkpoint (every model and optimizer variable, the RNG states and a JSON
header with the epoch, step and MLflow run id) is copied in whole and counts only once its
manifest, written last, matches it, on a local disk and on an object store
(``s3://bucket/run/checkpoints``) alike. A kill at any moment leaves either the previous
checkpoint or the new one as the newest that counts. On resume, checkpoints that do not load
are skipped with a warning and the newest one that does is used.

The training position is an epoch and the steps of it already run. With keras_dl's data
(:meth:`attach_data`), a header also holds the data position (``data_position``: which ranks ran
which steps, :mod:`keras_dl.data.stream.epoch_position`), the world size and the batch per rank, so a rerun on
another number of ranks trains the rest of the interrupted epoch, each row once. Without it, the
position is the optimizer's step counter. Either way a resumed mid-epoch checkpoint finishes
that epoch with only the steps it still lacked.

Example:
    >>> ckpt = Checkpoint("runs/my-model/checkpoints", keep=3)       # doctest: +SKIP
    >>> model.fit(ds, epochs=10, steps_per_epoch=100, callbacks=[ckpt])  # doctest: +SKIP
    >>> # killed? run the same code again: it resumes where the last checkpoint left off.
"""

from __future__ import annotations

import logging
import os
import time

import keras
import numpy as np

from keras_dl.checkpoints import (
    COMPLETE,
    FINISHING,
    Checkpoints,
    is_complete,
    list_checkpoints,
    mark_complete,
    read_header,
)
from keras_dl.checkpoints.resume import resume_newest
from keras_dl.distribute.broadcast import broadcast_ints
from keras_dl.distribute.world import current_world
from keras_dl.storage import Store

log = logging.getLogger(__name__)

# Re-exported: callers import them from here.
__all__ = [
    "COMPLETE",
    "FINISHING",
    "Checkpoint",
    "broadcast_position",
    "is_complete",
    "list_checkpoints",
    "mark_complete",
    "read_header",
]


class Checkpoint(keras.callbacks.Callback):
    """Write resumable checkpoints on rank 0, keep the last ``keep``, resume from the newest.

    Put it first in the callbacks list: when a mid-epoch checkpoint is resumed, it ends that
    epoch early by setting ``model.stop_training`` and clears the flag again in its own
    ``on_epoch_end``, before callbacks that may set it for their own reasons.

    Args:
        directory: Folder of the checkpoint files (created on rank 0): a local path, an
            object-store URI or a :class:`~keras_dl.storage.Store`.
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
            :meth:`save_final` and marks it with :meth:`Checkpoints.mark_complete
            <keras_dl.checkpoints.Checkpoints.mark_complete>` once all is done.
            Defaults to True.
    """

    def __init__(
        self,
        directory: Store | str | os.PathLike,
        every_n_steps: int = 0,
        keep: int = 3,
        resume: bool = True,
        metadata: dict | None = None,
        mark_complete: bool = True,
    ):
        super().__init__()
        self.checkpoints = Checkpoints(directory, keep)  # raises for keep < 1
        self.store = self.checkpoints.store
        self.directory = self.store.uri  # an absolute path or a URI
        self.every_n_steps = every_n_steps
        self.keep = keep
        self.resume = resume
        self.metadata = dict(metadata or {})
        self.mark_complete = mark_complete
        self.restored: dict | None = None  # the header of the checkpoint restored, if any
        self._restore_done = False
        self._data = None  # keras_dl's training split: the data position (attach_data)
        self._start: tuple[int, int] | None = None  # (epoch, its steps left), from attach_data
        # Save each epoch in on_epoch_end; False: a later callback calls save_epoch.
        self.save_at_epoch_end = True

    def attach_data(self, data, epoch: int = 0, steps_left: int | None = None) -> None:
        """Record ``data``'s position in every header, and start ``fit`` at ``epoch``.

        Args:
            data: The training :class:`~keras_dl.data.SplitData` (its ``record(epoch, steps)``
                and ``stream.options`` are read at each save).
            epoch: The epoch a resume starts in. Defaults to 0.
            steps_left: Steps of ``epoch`` still to run (None: all of them).
        """
        self._data = data
        self._start = (epoch, steps_left) if epoch or steps_left is not None else None

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
        self.restored = resume_newest(self.checkpoints, self.model, self.resume, self.metadata)
        return int(self.restored["global_step"]) if self.restored else 0

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
        elif self._start is not None:  # the data's own position (attach_data)
            epoch, left = self._start
            self.model._initial_epoch = epoch
            if left is not None and left < self._steps:
                self._truncate_after = left  # finish the interrupted epoch only
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
        at_epoch_end = self._steps_this_epoch == 0  # saved there (or just restored)
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
        self._epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if self._truncate_after is not None:
            self._truncate_after = None
            self.model.stop_training = False
        if self.save_at_epoch_end:
            self.save_epoch(epoch, logs)

    def save_epoch(self, epoch: int, logs=None) -> None:
        """Write epoch ``epoch``'s checkpoint, its logs in the header (``on_epoch_end`` calls
        it unless :attr:`save_at_epoch_end` is False: then call it after the callbacks that add
        to the epoch's logs and before the loggers, e.g. with :class:`SaveAtEpochEnd`)."""
        bad = [k for k, v in (logs or {}).items() if "loss" in k and not _finite(v)]
        if bad:  # a checkpoint of diverged weights would only resume the divergence
            log.warning("Not checkpointing epoch %d: %s not finite.", epoch + 1, ", ".join(bad))
            return
        # Kept in the header: a kill between this save and the loggers' send of the epoch's
        # metrics would otherwise leave that epoch missing from the resumed run's history.
        numbers = {k: float(v) for k, v in (logs or {}).items() if _finite(v) and _number(v)}
        self._last_epoch = {"epoch": epoch, "logs": numbers}
        self._epoch, self._steps_this_epoch = epoch + 1, 0
        self._save()

    def on_train_end(self, logs=None):
        self.model._initial_epoch = None  # a later fit call starts where the caller says
        self.restored = None
        self._start = None
        if self.mark_complete and self._chief and self.store.list():
            # fit returned normally: the next run in this directory starts fresh, not "resumes"
            self.checkpoints.mark_complete(self._global_step)

    # -- internals ---------------------------------------------------------------------------
    def _save(self, **extra) -> None:
        if not getattr(self, "_chief", False):
            return
        steps = self._steps or 1
        epoch, step = divmod(self._global_step, steps)
        data = {}
        if self._data is not None:
            position = self._data.record(getattr(self, "_epoch", 0), self._steps_this_epoch)
            epoch, step = position.epoch, position.steps
            options = self._data.stream.options
            data = {
                "data_position": position.to_json(),
                "world_size": options.num_shards,
                "rank_batch": options.batch_size,
            }
        header = {
            **self.metadata,
            **data,
            "epoch": epoch,
            "step": step,
            "global_step": self._global_step,
            "steps_per_epoch": self._steps,
            "time": time.time(),
            "last_epoch": self._last_epoch,
            **extra,
        }
        self.checkpoints.save(self._global_step, self.model, header)


class SaveAtEpochEnd(keras.callbacks.Callback):
    """``checkpoint``'s epoch-end save, where this callback stands in the list (after the ones
    that add to the epoch's logs, before the loggers): the header then holds every metric of
    the epoch (``rows_trained``, throughput), which a resumed run logs if the kill came before
    the loggers sent them; and an epoch whose checkpoint cannot be written (a full disk) is
    not logged, so the rerun that trains it again logs it once."""

    def __init__(self, checkpoint: Checkpoint):
        super().__init__()
        checkpoint.save_at_epoch_end = False
        self.checkpoint = checkpoint

    def on_epoch_end(self, epoch, logs=None):
        self.checkpoint.save_epoch(epoch, logs)


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
    step, done = broadcast_ints([step, done], prefix="checkpoint_step")
    return step, done


def _number(value) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, bool)
