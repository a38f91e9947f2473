"""Write a folder-per-class image tree into a Delta table of encoded bytes plus labels.

``DIR/<class>/<file>`` becomes one row: ``image`` (the file's bytes, not decoded), ``label``
(int64, the class's index in sorted class names), ``label_name`` and ``path`` (relative to DIR).
A tree split beforehand, ``DIR/{train,validation,test}/<class>/<file>``, keeps its splits in a
``split`` partition column; ``--resplit 0.8,0.1,0.1`` makes one (stratified, seeded). Files that
are not whole JPEG/PNG/GIF/BMP images are skipped and counted.

Example::

    keras-dl ingest images ~/photos --to data/photos --resplit 0.8,0.1,0.1

``--rows-per-group 0`` (the default) sizes row groups to about 16 MB each.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass, field

import numpy as np

from keras_dl.errors import DataError

ROWS_PER_GROUP = 0  # auto: about 16 MB per row group
EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp")
SPLIT_DIRS = {"train": "train", "validation": "validation", "val": "validation", "test": "test"}
_BATCH_FILES = 256
log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``keras-dl ingest images`` arguments (``--to``/``--mode``/``--rows-per-group`` come
    from the CLI)."""
    p.add_argument("dir", help="folder with one sub-folder of images per class")
    p.add_argument(
        "--resplit",
        default="",
        metavar="TRAIN,VAL,TEST",
        help="add a split column with these fractions (stratified by class)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for --resplit (default: 0)")


def run(args) -> int:
    """Ingest and print the report."""
    from keras_dl.data.ingest.datasets import parse_fractions

    report = ingest_images(
        args.dir,
        args.to,
        mode=args.mode,
        rows_per_group=args.rows_per_group,
        resplit=parse_fractions(args.resplit),
        seed=args.seed,
    )
    print(report)
    if report.skipped:
        print(
            f"skipped {len(report.skipped)} file(s) that are not whole images, e.g. "
            f"{', '.join(report.skipped[:3])}"
        )
    return 0


@dataclass(frozen=True)
class ImageTree:
    """The files of an image tree: relative paths, class names, labels and splits."""

    paths: list[str]
    classes: list[str]
    labels: np.ndarray
    splits: np.ndarray | None
    ignored: list[str] = field(default_factory=list)


def scan_tree(root: str) -> ImageTree:
    """List ``root/<class>/*`` (or ``root/<split>/<class>/*``) image files, sorted.

    Raises:
        DataError: When ``root`` is missing or holds no class folder with images.
    """
    if not os.path.isdir(root):
        raise DataError(f"Image folder {root!r} does not exist. Pass a folder of class folders.")
    top = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    by_split = bool(top) and all(d in SPLIT_DIRS for d in top)
    entries, ignored = [], []  # (relative path, class, split)
    for split_dir in top if by_split else [""]:
        base = os.path.join(root, split_dir)
        for cls in sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d))):
            for dirpath, _, files in sorted(os.walk(os.path.join(base, cls))):
                for name in sorted(files):
                    rel = os.path.relpath(os.path.join(dirpath, name), root)
                    if name.lower().endswith(EXTENSIONS):
                        entries.append((rel, cls, SPLIT_DIRS.get(split_dir)))
                    else:
                        ignored.append(rel)
    if not entries:
        raise DataError(
            f"Image folder {root!r} holds no images ({', '.join(EXTENSIONS)}) in class "
            "sub-folders. Lay it out as DIR/<class>/<image> (or DIR/train/<class>/<image>)."
        )
    classes = sorted({c for _, c, _ in entries})
    index = {c: i for i, c in enumerate(classes)}
    labels = np.array([index[c] for _, c, _ in entries], dtype=np.int64)
    splits = np.array([s for _, _, s in entries], dtype=object) if by_split else None
    return ImageTree([e[0] for e in entries], classes, labels, splits, ignored)


@dataclass(frozen=True)
class ImagesReport:
    """The Delta write report plus the files skipped as not whole images."""

    written: object
    classes: list[str]
    skipped: list[str]

    def __str__(self) -> str:
        return f"{self.written}; {len(self.classes)} classes: {', '.join(self.classes[:20])}"


def ingest_images(
    root: str,
    to: str,
    mode: str = "error",
    rows_per_group: int = 0,
    resplit: tuple[float, ...] = (),
    seed: int = 0,
) -> ImagesReport:
    """Write the image tree at ``root`` as a Delta table (streamed, one commit).

    Args:
        root: Folder of class folders (optionally under train/validation/test folders).
        to: Delta table path to write.
        mode: "error", "append", "overwrite" or "ignore" if the table exists. Defaults to "error".
        rows_per_group: Rows per row group; 0 sizes groups to ~16 MB. Defaults to 0.
        resplit: (train, validation, test) fractions for a new split column. Defaults to ().
        seed: Seed for ``resplit``. Defaults to 0.
    """
    import pyarrow as pa

    from keras_dl.data.ingest.datasets import assign_splits, rows_per_group_for, write_table
    from keras_dl.data.tables.images import check_image_bytes

    tree = scan_tree(root)
    splits = assign_splits(tree.labels, resplit, seed) if resplit else tree.splits
    skipped: list[str] = []

    def batches():
        for start in range(0, len(tree.paths), _BATCH_FILES):
            idx = np.arange(start, min(start + _BATCH_FILES, len(tree.paths)))
            blobs = [_read(os.path.join(root, tree.paths[i])) for i in idx]
            ok = check_image_bytes(blobs)
            skipped.extend(tree.paths[i] for i in idx[~ok])
            keep = idx[ok]
            if not len(keep):
                continue
            cols = {
                "image": pa.array([b for b, k in zip(blobs, ok) if k], pa.binary()),
                "label": pa.array(tree.labels[keep]),
                "label_name": pa.array([tree.classes[i] for i in tree.labels[keep]], pa.string()),
                "path": pa.array([tree.paths[i] for i in keep], pa.string()),
            }
            if splits is not None:
                cols["split"] = pa.array(list(splits[keep]), pa.string())
            yield pa.RecordBatch.from_pydict(cols)

    stream = batches()
    first = next(stream, None)
    if first is None:
        raise DataError(f"No file under {root!r} is a whole JPEG/PNG/GIF/BMP image.")
    if rows_per_group <= 0:
        rows_per_group = rows_per_group_for(first.nbytes / first.num_rows)

    def all_batches():
        yield first
        yield from stream

    reader = pa.RecordBatchReader.from_batches(first.schema, all_batches())
    written = write_table(
        reader,
        to,
        partition_by=["split"] if splits is not None else (),
        mode=mode,
        rows_per_group=rows_per_group,
    )
    if skipped:
        log.warning("Skipped %d file(s) that are not whole images: %s", len(skipped), skipped[:5])
    return ImagesReport(written, tree.classes, skipped)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
