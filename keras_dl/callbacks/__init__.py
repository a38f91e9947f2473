"""Keras callbacks usable in any ``model.fit``; each is rank-aware."""

from keras_dl.callbacks.mlflow_logger import MLflowLogger

__all__ = ["MLflowLogger"]
