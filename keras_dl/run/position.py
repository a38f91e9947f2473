"""A checkpoint's data position, and the line a resume on another number of ranks prints.

The header of a checkpoint written by keras_dl's training holds ``data_position`` (see
:mod:`keras_dl.data.stream.epoch_position`), ``world_size`` and ``rank_batch``. A header from before positions
were recorded resumes at an epoch's start; one written mid-epoch is refused by name, since which
rows it had trained cannot be known.
"""

from __future__ import annotations

from keras_dl.data.stream.epoch_position import EpochPosition, Resume
from keras_dl.errors import ConfigError

RESUME_TAG = "keras_dl.resumed_on_other_ranks"


def data_position(header: dict, where: str) -> EpochPosition:
    """The data position of a restored checkpoint ``header`` (from folder ``where``).

    Raises:
        ConfigError: For a header that names no position mid-epoch, or an unreadable one.
    """
    if "data_position" in header:
        try:
            return EpochPosition.from_json(header["data_position"])
        except ValueError as exc:
            raise ConfigError(
                f"The checkpoint in {where} holds an unreadable data position ({exc}). Set "
                "runtime.resume=false to start a new training (the checkpoints are kept aside)."
            ) from None
    epoch, step = int(header.get("epoch", 0)), int(header.get("step", 0))
    if step:
        raise ConfigError(
            f"The checkpoint in {where} stopped in epoch {epoch + 1} at step {step}, and was "
            "written by a keras_dl that did not record which rows those steps trained, so the "
            "rest of that epoch cannot be read exactly. Resume it with the keras_dl that wrote "
            "it, or set runtime.resume=false to start a new training."
        )
    return EpochPosition(epoch)


def resume_note(
    resume: Resume, header: dict, rows: int, lr_scaling: str, replicas: int
) -> str | None:
    """The line a resume on another number of ranks prints (None on the same ranks).

    Args:
        resume: Where the data resumes.
        header: The restored checkpoint's header.
        rows: The training split's live rows.
        lr_scaling: ``runtime.lr_scaling``.
        replicas: The replicas the learning rate now scales to.
    """
    before = header.get("world_size")
    ranks = resume.layout.ranks
    if before is None or int(before) == ranks:
        return None
    done = resume.trained_before / rows if rows else 0.0
    line = (
        f"Resuming epoch {resume.epoch + 1} at {done:.0%} on {ranks} rank(s) "
        f"(checkpoint written on {before}): the rest of its rows are planned over {ranks}, "
        "each trained once."
    )
    if lr_scaling == "linear":
        line += f" The learning rate scales to {replicas} replica(s) (runtime.lr_scaling=linear)."
    return line
