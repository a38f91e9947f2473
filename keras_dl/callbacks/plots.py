"""Plots: loss/metric curves and a confusion matrix as PNG artifacts of the MLflow run.

At the end of training, rank 0 draws (matplotlib figures rendered with Agg: no display, no pyplot state):

- ``plots/curves.png``: every epoch metric, training and validation side by side. When an MLflow
  run is known the curves come from the run's metric history, so a resumed run's plot covers
  the epochs of the interrupted process too.
- ``plots/confusion_matrix.png``: for classifiers (integer labels, one score per class), when
  ``confusion_data`` is given.

Example:
    >>> plots = Plots(confusion_data=(x_val, y_val), class_names=list("0123456789"))  # doctest: +SKIP
    >>> with mlflow.start_run():                                                       # doctest: +SKIP
    ...     model.fit(x, y, validation_data=(x_val, y_val), callbacks=[plots])
"""

from __future__ import annotations

import logging
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import keras
import numpy as np

from keras_dl import tracking
from keras_dl.distribute.world import current_world

log = logging.getLogger(__name__)

# Throughput figures are logged beside the metrics but are not learning curves.
SKIP_PREFIXES = (
    "samples_per_sec",
    "steps_per_sec",
    "step_time_ms",
    "input_wait_fraction",
    "input_wait_ms",
)


class Plots(keras.callbacks.Callback):
    """Draw learning curves (and a confusion matrix) at the end and log them to MLflow.

    Args:
        run_id: MLflow run for the artifacts. Defaults to the active run; with neither, the
            PNGs are only written to ``output_dir``.
        confusion_data: ``(x, y)`` arrays, or ``(dataset, steps)`` with a ``tf.data`` dataset
            of ``(features, labels)`` batches, for the confusion matrix. Defaults to None.
        class_names: Names of the classes, in label order. Defaults to the label numbers.
        output_dir: Where the PNGs are written. Defaults to a temporary folder.
        tracking_uri: Tracking URI. Defaults to MLflow's current URI.
    """

    def __init__(
        self,
        run_id: str | None = None,
        confusion_data: Any = None,
        class_names: list[str] | None = None,
        output_dir: str | None = None,
        tracking_uri: str | None = None,
    ):
        super().__init__()
        self.run_id = run_id
        self.confusion_data = confusion_data
        self.class_names = class_names
        self.output_dir = output_dir
        self.tracking_uri = tracking_uri
        self.paths: list[Path] = []

    def on_train_begin(self, logs=None):
        self.history: dict[str, dict[int, float]] = defaultdict(dict)
        self.paths = []

    def on_epoch_end(self, epoch, logs=None):
        for k, v in (logs or {}).items():
            if not k.startswith(SKIP_PREFIXES) and isinstance(v, (int, float)):
                self.history[k][epoch] = float(v)

    def on_train_end(self, logs=None):
        if not current_world().is_chief:
            return
        try:
            out = Path(self.output_dir or tempfile.mkdtemp(prefix="keras_dl_plots_"))
            out.mkdir(parents=True, exist_ok=True)
            client, run_id = self._mlflow()
            history = self._full_history(client, run_id)
            if history:
                self.paths.append(plot_curves(history, out / "curves.png"))
            matrix = self._confusion()
            if matrix is not None:
                self.paths.append(
                    plot_confusion(matrix, out / "confusion_matrix.png", self.class_names)
                )
            if client is not None:
                for p in self.paths:
                    client.log_artifact(run_id, str(p), artifact_path="plots")
        except Exception as exc:  # plots are a nicety: never fail a finished training for them
            log.warning("Plots: could not draw or log the plots (%s).", exc)

    # -- internals ---------------------------------------------------------------------------
    def _mlflow(self):
        run_id = self.run_id or tracking.active_run_id()
        if run_id is None:
            return None, None
        return tracking.client(self.tracking_uri), run_id

    def _full_history(self, client, run_id) -> dict[str, dict[int, float]]:
        history = {k: dict(v) for k, v in self.history.items()}
        if client is None:
            return history
        for key in list(history):
            try:
                for m in client.get_metric_history(run_id, key):
                    history[key].setdefault(m.step, m.value)  # this process's values win
            except Exception:
                pass
        return history

    def _confusion(self) -> np.ndarray | None:
        if self.confusion_data is None:
            return None
        from keras_dl.distribute.multiworker import local_model

        model = local_model(self.model)  # the chief alone predicts: not through collectives
        labels, scores = [], []
        first, second = self.confusion_data
        if isinstance(second, int):  # (dataset, steps)
            for features, y in first.take(second):
                scores.append(np.asarray(model.predict_on_batch(features)))
                labels.append(np.asarray(y))
        else:
            scores.append(np.asarray(model.predict(first, verbose=0)))
            labels.append(np.asarray(second))
        y_true, y_score = np.concatenate(labels).reshape(-1), np.concatenate(scores)
        if y_score.ndim != 2 or y_score.shape[1] < 2 or y_true.dtype.kind not in "iu":
            return None  # not a classifier with integer labels
        k = y_score.shape[1]
        matrix = np.zeros((k, k), dtype=np.int64)
        np.add.at(matrix, (y_true.astype(np.int64), y_score.argmax(1)), 1)
        return matrix


def plot_curves(history: dict[str, dict[int, float]], path: str | Path) -> Path:
    """One panel per metric (``val_`` values on the same panel); returns the PNG path."""
    from matplotlib.figure import Figure  # a bare Figure renders with Agg, no pyplot state
    from matplotlib.ticker import MaxNLocator

    names = sorted({k.removeprefix("val_") for k in history})
    fig = Figure(figsize=(4.5 * len(names), 3.5))
    axes = fig.subplots(1, len(names), squeeze=False)
    for ax, name in zip(axes[0], names):
        for key, style in ((name, "-o"), (f"val_{name}", "--s")):
            if key in history:
                steps = sorted(history[key])
                ax.plot(
                    [s + 1 for s in steps], [history[key][s] for s in steps], style, label=key, ms=3
                )
        ax.set_title(name)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return Path(path)


def plot_confusion(matrix: np.ndarray, path: str | Path, class_names=None) -> Path:
    """The confusion matrix with counts in the cells (rows: true class); returns the PNG path."""
    from matplotlib.figure import Figure

    k = matrix.shape[0]
    names = list(class_names) if class_names else [str(i) for i in range(k)]
    fig = Figure(figsize=(1.5 + 0.5 * k, 1.5 + 0.5 * k))
    ax = fig.subplots()
    ax.imshow(matrix, cmap="Blues")
    for i in range(k):
        for j in range(k):
            color = "white" if matrix[i, j] > matrix.max() / 2 else "black"
            ax.text(j, i, str(matrix[i, j]), ha="center", va="center", fontsize=8, color=color)
    ax.set_xticks(range(k), names, rotation=45)
    ax.set_yticks(range(k), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(f"confusion matrix (accuracy {np.trace(matrix) / max(matrix.sum(), 1):.3f})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return Path(path)
