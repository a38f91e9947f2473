"""Strategies and the world context (rank, size, chief) for one device, MirroredStrategy and Horovod."""

from keras_dl.distribute.world import World, current_world

__all__ = ["World", "current_world"]
