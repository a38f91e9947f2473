"""Throughput: samples/s, step time and the time steps spend waiting for input.

The figures are added to the epoch's ``logs`` (so a logger later in the callbacks list, such as
:class:`~keras_dl.callbacks.MLflowLogger`, and ``History`` record them), and, every N steps, to
the step's ``logs``:

- ``samples_per_sec``: training samples per second over the epoch's steps (validation excluded);
- ``step_time_ms``: mean wall time of one training step;
- ``input_wait_fraction``: the share of step time the step waited for its batch: from the
  step's start to the moment its batch was ready (0 when it was ready before the step began),
  so the step's own dispatch does not count as waiting. It needs the training dataset wrapped
  with :meth:`Throughput.instrument`; without it it is not reported;
- ``input_wait_ms``: the same wait in milliseconds, the mean per step (over the steps whose
  wait was measured). Unlike the fraction it does not shrink when the steps themselves get
  slower (a loaded host): a step that waits 50 ms for each batch shows 50 here.

Example:
    >>> tp = Throughput(batch_size=64)                                    # doctest: +SKIP
    >>> ds = tp.instrument(ds)                                            # doctest: +SKIP
    >>> model.fit(ds, epochs=3, steps_per_epoch=100, callbacks=[tp, MLflowLogger()])  # doctest: +SKIP
"""

from __future__ import annotations

import time

import keras


class Throughput(keras.callbacks.Callback):
    """Measure training speed per epoch (and every N steps) and add it to the logs.

    Put it before the loggers in the callbacks list: Keras hands the same ``logs`` dict to
    each callback in turn, so later callbacks see the figures this one adds.

    Args:
        batch_size: Global batch size (all replicas together), for samples/s. Defaults to None
            (only ``steps_per_sec`` is reported).
        log_every_n_steps: Also add the figures of the last N steps to every N-th step's logs
            (0: per epoch only). Defaults to 0.
        prefix: Prefix of the keys added to the logs. Defaults to "".
        wait_every_n_steps: Measure the input wait on one step in N: reading the stamp costs
            about as much CPU as 8% of a 3 ms step, sampling keeps it well under 1%.
            Defaults to 8.
    """

    def __init__(
        self,
        batch_size: int | None = None,
        log_every_n_steps: int = 0,
        prefix: str = "",
        wait_every_n_steps: int = 8,
    ):
        super().__init__()
        self.batch_size = batch_size
        self.wait_every_n_steps = max(1, wait_every_n_steps)
        self.log_every_n_steps = log_every_n_steps
        self.prefix = prefix
        self._ready = None  # tf.Variable stamped by the instrumented dataset
        self.epoch_stats: dict[str, float] = {}
        if log_every_n_steps:
            self.on_train_batch_end = self._add_step_figures

    def instrument(self, dataset):
        """Return ``dataset`` with final stages that stamp when each batch was ready.

        Each batch is stamped as a one-batch ``prefetch`` takes it from ``dataset`` (as soon as
        it is produced, or when the batch before it is handed over if it was produced earlier),
        and the stamp travels with the batch to the consumer. The time from a step's start to
        its batch's stamp is the time that step waited for input. (Stamping at the hand-over
        counted the step's own dispatch as waiting: 0.18-0.20 of a 6 ms step fed from memory.)

        Args:
            dataset: A ``tf.data.Dataset`` (the training data).

        Returns:
            The same elements, with the stamping stage appended.
        """
        import tensorflow as tf

        if self._ready is None:
            self._ready = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="input_ready")
        ready = self._ready

        def produced(*batch):
            return tf.timestamp(), batch

        def handed(stamp, batch):
            with tf.control_dependencies([ready.assign(stamp)]):
                out = tf.nest.map_structure(tf.identity, batch)
            return out if len(out) > 1 else out[0]

        return dataset.map(produced).prefetch(1).map(handed)

    # Steps are timed from one batch *begin* to the next: no batch-end hook, which on backends
    # that dispatch batch-end callbacks asynchronously (JAX) would turn that off.
    def on_train_begin(self, logs=None):
        self.epoch_stats = {}
        self._window = _Window()
        self._epoch = _Window()
        self._step = 0
        self._begin: float | None = None
        self._step_figures: dict[str, float] = {}

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = _Window()
        self._epoch_start = time.time()
        self._train_end = None
        self._begin = None

    def on_train_batch_begin(self, batch, logs=None):
        now = time.time()
        self._close_step(now)
        self._begin = now

    def on_test_begin(self, logs=None):
        if self._train_end is None:  # validation inside fit: training time of the epoch ends
            self._train_end = time.time()
            self._close_step(self._train_end)

    def on_epoch_end(self, epoch, logs=None):
        end = self._train_end or time.time()
        self._close_step(end)
        self.epoch_stats = self._figures(self._epoch, wall=end - self._epoch_start)
        if logs is not None:
            logs.update(self.epoch_stats)

    def _add_step_figures(self, batch, logs=None):
        """Bound as ``on_train_batch_end`` only with ``log_every_n_steps`` (step logging needs
        the step's logs anyway): closes the step and hands the window's figures to the loggers
        after this callback."""
        self._close_step(time.time())
        if self._step_figures and logs is not None:
            logs.update(self._step_figures)
            self._step_figures = {}

    def _close_step(self, end: float) -> None:
        """Account the step that began at ``self._begin`` and ended at ``end``."""
        if self._begin is None:
            return
        begin, self._begin = self._begin, None
        wait = None
        # Sampled: the 2nd step of each epoch (the 1st also waits for the iterator to start),
        # then one in N (every step when N is 1).
        n = self.wait_every_n_steps
        if self._ready is not None and self._epoch.steps % n == 1 % n:
            # The stamp of this step's batch (the next one is only fetched by the next step).
            # Clamped: it can precede the step when the batch was fetched earlier.
            wait = min(max(float(self._ready.numpy()) - begin, 0.0), end - begin)
        self._epoch.add(end - begin, wait)
        self._window.add(end - begin, wait)
        self._step += 1
        n = self.log_every_n_steps
        if n and self._step % n == 0:
            self._step_figures = self._figures(self._window)
            self._window = _Window()

    # -- internals ---------------------------------------------------------------------------
    def _figures(self, w: _Window, wall: float | None = None) -> dict[str, float]:
        if not w.steps:
            return {}
        # Over an epoch, use wall time (it includes the callbacks' own time between steps).
        elapsed = wall if wall is not None else w.step_time
        p = self.prefix
        out = {f"{p}step_time_ms": 1000.0 * w.step_time / w.steps}
        if self.batch_size:
            out[f"{p}samples_per_sec"] = w.steps * self.batch_size / max(elapsed, 1e-9)
        else:
            out[f"{p}steps_per_sec"] = w.steps / max(elapsed, 1e-9)
        if w.waited is not None:  # over the steps whose wait was measured
            out[f"{p}input_wait_fraction"] = w.waited / max(w.sampled_time, 1e-9)
            out[f"{p}input_wait_ms"] = 1000.0 * w.waited / w.sampled
        return out


class _Window:
    """Step count, summed step time, and the input wait over the sampled steps."""

    def __init__(self):
        self.steps = 0
        self.step_time = 0.0
        self.waited: float | None = None
        self.sampled = 0  # steps whose wait was measured
        self.sampled_time = 0.0  # their step time

    def add(self, step_time: float, wait: float | None) -> None:
        self.steps += 1
        self.step_time += step_time
        if wait is not None:
            self.waited = (self.waited or 0.0) + wait
            self.sampled += 1
            self.sampled_time += step_time
