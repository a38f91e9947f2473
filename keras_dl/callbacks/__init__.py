"""Keras callbacks usable in any ``model.fit``; each is rank-aware (side effects on rank 0 only).

Example:
    >>> from keras_dl.callbacks import Checkpoint, EarlyStopping, MLflowLogger, Throughput
"""

from keras_dl.callbacks.checkpoint import Checkpoint
from keras_dl.callbacks.early_stopping import EarlyStopping
from keras_dl.callbacks.horovod import BroadcastState
from keras_dl.callbacks.mlflow_logger import MLflowLogger
from keras_dl.callbacks.plots import Plots
from keras_dl.callbacks.progress_bar import ProgressBar
from keras_dl.callbacks.prometheus import PrometheusMetrics
from keras_dl.callbacks.system_metrics import SystemMetrics
from keras_dl.callbacks.system_sampler import SystemSampler
from keras_dl.callbacks.throughput import Throughput

__all__ = [
    "BroadcastState",
    "Checkpoint",
    "EarlyStopping",
    "MLflowLogger",
    "Plots",
    "ProgressBar",
    "PrometheusMetrics",
    "SystemMetrics",
    "SystemSampler",
    "Throughput",
]
