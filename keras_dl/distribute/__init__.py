"""Strategies and the world context (rank, size, chief) for one device, MirroredStrategy and
Horovod, and Horovod for Keras 3 (:mod:`.horovod`). The Keras callbacks for Horovod are in
:mod:`keras_dl.callbacks.horovod`; launching on ranks is :mod:`keras_dl.launch`."""

from keras_dl.distribute.world import World, current_world

__all__ = ["World", "current_world"]
