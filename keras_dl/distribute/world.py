"""Who this process is in a distributed job: rank, size and whether it is the chief.

Side effects (MLflow, checkpoints, the registry, progress bars) run on the chief only; data is
sharded by rank. Under Horovod the world is its ranks; under TF's multi-worker strategy its
workers (rank = the task index in ``TF_CONFIG``, worker 0 the chief); else one process of rank 0.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class World:
    """Rank and size of this process, and of its node."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1

    @property
    def is_chief(self) -> bool:
        """True on rank 0, the one process that writes."""
        return self.rank == 0


def current_world() -> World:
    """The world of this process: the multi-worker strategy's once
    :func:`keras_dl.distribute.multiworker.init` ran, Horovod's when it is initialized, else a
    single process."""
    multiworker = sys.modules.get("keras_dl.distribute.multiworker")
    if multiworker is not None and multiworker.world() is not None:
        return multiworker.world()
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is not None:
        try:
            if hvd.is_initialized():
                return World(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())
        except (AttributeError, ValueError):
            pass
    return World()


def on_chief(world: World | None = None) -> bool:
    """True when this process should perform side effects (rank 0)."""
    return (world or current_world()).is_chief
