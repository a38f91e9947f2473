"""Strategies and the world context (rank, size, chief) for one device, MirroredStrategy and
Horovod; Horovod for Keras 3 (:mod:`.horovod`, :mod:`.callbacks`) and :class:`HorovodRunner`."""

from keras_dl.distribute.runner import HorovodRunner, launch
from keras_dl.distribute.world import World, current_world

__all__ = ["HorovodRunner", "World", "current_world", "launch"]
