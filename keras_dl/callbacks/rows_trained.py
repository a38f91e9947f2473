"""RowsTrained: how many live rows each epoch trained, over all ranks, as ``rows_trained``.

Counted where the rows are handed to training (the data stream counts the live rows of each
epoch it yields, padding not included), summed over the ranks at the epoch's end, and put in the
epoch's logs, so MLflow records it beside the loss. An epoch that a resume split between
attempts counts the rows trained before the resume too (on rank 0, once), so every epoch reads
the split's rows: a figure that shows at a glance that no row was lost or repeated.
"""

from __future__ import annotations

import keras

from keras_dl.distribute.world import current_world

METRIC = "rows_trained"


class RowsTrained(keras.callbacks.Callback):
    """Put each epoch's live rows trained (all ranks) in its logs as ``rows_trained``.

    Args:
        data: The training :class:`~keras_dl.data.SplitData` (its ``rows_seen(epoch)``).
        before: ``{epoch: rows}`` trained before this attempt (a resumed epoch's first part,
            over all ranks). Defaults to none.
    """

    def __init__(self, data, before: dict[int, int] | None = None):
        super().__init__()
        self.data = data
        self.before = dict(before or {})

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        world = current_world()
        rows = self.data.rows_seen(epoch)
        if world.is_chief:
            rows += self.before.get(epoch, 0)
        if world.size > 1:
            from keras_dl.distribute import collective

            # Collective: every rank sends its count; float64 is exact below 2**53 rows.
            rows = int(
                round(collective.allgather_rows([[rows]], prefix=f"rows_trained{epoch}").sum())
            )
        logs[METRIC] = rows
        by_source = getattr(getattr(self.data, "stream", None), "rows_by_source", None)
        if by_source is None:
            return
        # A mixed split (data.sources): each source's live rows, summed over the ranks, with
        # those a resumed epoch trained before this attempt (on rank 0, once).
        counts = by_source(epoch)
        if world.is_chief:
            before = self.data.stream.sources_before.get(epoch, {})
            counts = {name: n + before.get(name, 0) for name, n in counts.items()}
        if world.size > 1:
            from keras_dl.distribute import collective

            values = [[float(counts[name]) for name in counts]]
            gathered = collective.allgather_rows(values, prefix=f"rows_trained_sources{epoch}")
            counts = {name: int(round(v)) for name, v in zip(counts, gathered.sum(axis=0))}
        for name, value in counts.items():
            logs[f"{METRIC}/{name}"] = value
