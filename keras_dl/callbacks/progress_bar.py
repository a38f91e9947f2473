"""ProgressBar: Keras' progress bar (with its ETA) plus samples/s, shown on rank 0 only.

It is a ``keras.callbacks.ProgbarLogger``, so passing it replaces the bar ``fit`` would add;
``fit(verbose=1)`` draws a bar per epoch, ``verbose=2`` one line per epoch.

Example:
    >>> model.fit(ds, epochs=3, callbacks=[ProgressBar(batch_size=64)])  # doctest: +SKIP
    Epoch 1/3
    40/100 ━━━━━━━━────────── 1s 12ms/step - loss: 0.51 - samples/s: 5301.2
"""

from __future__ import annotations

import time

import keras

from keras_dl.distribute.world import current_world


class ProgressBar(keras.callbacks.ProgbarLogger):
    """A progress bar with ETA and samples/s, silent on ranks other than 0.

    Args:
        batch_size: Global batch size, to turn steps into samples. Defaults to None (the bar
            shows steps/s instead).
    """

    def __init__(self, batch_size: int | None = None):
        super().__init__()
        self.batch_size = batch_size
        self._start = time.time()

    def set_params(self, params):
        super().set_params(params)
        if not current_world().is_chief:
            self.verbose = 0  # one bar per job, not one per rank

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.time()
        super().on_epoch_begin(epoch, logs)

    def on_train_batch_end(self, batch, logs=None):
        # A copy: the rate is for display only and must not reach other callbacks' logs.
        super().on_train_batch_end(batch, {**(logs or {}), **self._rate(batch + 1)})

    def _rate(self, steps: int) -> dict[str, float]:
        elapsed = max(time.time() - self._start, 1e-9)
        if self.batch_size:
            return {"samples/s": steps * self.batch_size / elapsed}
        return {"steps/s": steps / elapsed}
