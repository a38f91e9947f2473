"""Encoded images (JPEG, PNG, GIF, BMP bytes in a binary column) to normalized float tensors.

The decoding happens inside tf.data, on whole batches, in parallel (``map`` with AUTOTUNE over
batches and ``map_fn`` inside each batch), never in the Python reader. A recipe passes an
:class:`ImagePreprocess` as its ``preprocess`` hook and another with ``augment=True`` as its
``preprocess_train`` hook (augmentation on the training split only), and accepts binary columns::

    from keras_dl.data.tables.images import make_image_preprocess

    RECIPE = Recipe(
        ...,
        accept=("binary",),
        preprocess=make_image_preprocess("image", image_size=(128, 128)),
        preprocess_train=make_image_preprocess("image", image_size=(128, 128), augment=True),
    )

``data.image_size`` and ``data.on_bad_image`` override the hook's settings at run time (see
:func:`configure`). Undecodable images either stop the run (``"fail"``, the error names the file,
row group and row) or are dropped from their batch and counted (``"skip"``); the count is
reported by :meth:`ImagePreprocess.skipped` and logged to MLflow as ``data.bad_images_skipped``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from keras_dl.errors import DataError

ON_BAD_IMAGE = ("fail", "skip")
NORMALIZE = ("unit", "symmetric", "imagenet", "none")
BAD_IMAGE_MARKER = "keras_dl.bad_image"
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ImagePreprocess:
    """A tf.data hook ``fn(features, label) -> (features, label)`` that decodes image bytes.

    Args:
        column: Feature holding the bytes when the features are a dict; ignored when the image
            is the only feature. Defaults to "image".
        image_size: (height, width) every image is resized to (bilinear). Defaults to (224, 224).
        channels: 3 (RGB) or 1 (grayscale); PNGs with alpha lose it. Defaults to 3.
        normalize: "unit" (0..1), "symmetric" (-1..1), "imagenet" (mean/std of ImageNet) or
            "none" (0..255 floats, for models that rescale themselves). Defaults to "unit".
        augment: Random horizontal flip, crop (80-100% of the area) and brightness/contrast
            jitter; use it for the training split only. Defaults to False.
        on_bad_image: "fail" or "skip" (drop the row and count it). Defaults to "fail".
    """

    column: str = "image"
    image_size: tuple[int, int] = (224, 224)
    channels: int = 3
    normalize: str = "unit"
    augment: bool = False
    on_bad_image: str = "fail"
    # Holds the skip counter (a tf.Variable made on first use); not part of the config.
    _state: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        if len(self.image_size) != 2 or min(self.image_size) < 1:
            raise DataError(f"image_size must be (height, width) > 0, got {self.image_size}.")
        if self.channels not in (1, 3):
            raise DataError(f"channels must be 1 or 3, got {self.channels}.")
        if self.normalize not in NORMALIZE:
            raise DataError(f"normalize={self.normalize!r} is not one of {', '.join(NORMALIZE)}.")
        if self.on_bad_image not in ON_BAD_IMAGE:
            raise DataError(f"data.on_bad_image={self.on_bad_image!r} is not one of fail, skip.")

    # With several ranks the training rows carry sample weights: "skip" drops a row's weight
    # with the row (tfdata's hook wrapper calls hooks that say so with all three).
    takes_weights = True

    def __call__(self, features, label=None, weight=None):
        import tensorflow as tf

        is_dict = isinstance(features, dict)
        data = features[self.column] if is_dict else features
        valid = valid_image_mask(data)
        if self.on_bad_image == "skip":
            self._counter().assign_add(tf.reduce_sum(tf.cast(~valid, tf.int64)))
            keep = lambda t: tf.boolean_mask(t, valid)  # noqa: E731
            features = {k: keep(v) for k, v in features.items()} if is_dict else keep(features)
            label = None if label is None else keep(label)
            weight = None if weight is None else keep(weight)
            data = features[self.column] if is_dict else features
        else:
            # The marker lets SplitData.original_error find the rows and name file and row group.
            tf.debugging.assert_equal(
                tf.reduce_all(valid),
                True,
                message=f"{BAD_IMAGE_MARKER} column={self.column}: undecodable image in a batch",
            )
        images = self._decode(data)
        if self.augment:
            images = _augment(images)
        images = _normalize(images, self.normalize, self.channels)
        if is_dict:
            features = {**features, self.column: images}
        else:
            features = images
        if weight is not None:
            return features, label, weight
        return features if label is None else (features, label)

    @property
    def deterministic(self) -> bool:
        """The same bytes always give the same output: no augmentation, and no skip counter
        (which counts every read). ``make_dataset`` may then cache the decoded images."""
        return not self.augment and self.on_bad_image == "fail"

    def skipped(self) -> int:
        """Rows dropped as undecodable so far (every read counts, across epochs)."""
        counter = self._state.get("skipped")
        return 0 if counter is None else int(counter.numpy())

    def _decode(self, data):
        import tensorflow as tf

        h, w = self.image_size

        def one(encoded):
            img = tf.io.decode_image(encoded, channels=self.channels, expand_animations=False)
            # Images ingested at the model's size skip the resize (a bilinear pass per image).
            same = tf.reduce_all(tf.equal(tf.shape(img)[:2], (h, w)))
            img = tf.cond(
                same,
                lambda: tf.cast(img, tf.float32),
                lambda: tf.image.resize(img, (h, w)),  # float32, 0..255
            )
            return tf.ensure_shape(img, (h, w, self.channels))

        # map_fn runs iterations in parallel; tf.data runs several batches at once on top.
        return tf.map_fn(
            one,
            data,
            fn_output_signature=tf.TensorSpec((h, w, self.channels), tf.float32),
            parallel_iterations=16,
        )

    def _counter(self):
        import tensorflow as tf

        if "skipped" not in self._state:
            # Made eagerly, outside the tf.data function being traced.
            with tf.init_scope():
                self._state["skipped"] = tf.Variable(0, dtype=tf.int64, trainable=False)
        return self._state["skipped"]


def make_image_preprocess(
    column: str = "image",
    image_size: Sequence[int] = (224, 224),
    *,
    channels: int = 3,
    normalize: str = "unit",
    augment: bool = False,
    on_bad_image: str = "fail",
) -> ImagePreprocess:
    """The hook a recipe uses as ``preprocess`` (or ``preprocess_train`` with ``augment=True``).

    See :class:`ImagePreprocess` for the arguments.
    """
    return ImagePreprocess(column, tuple(image_size), channels, normalize, augment, on_bad_image)


def configure(hook, data) -> object:
    """Apply ``data.image_size`` / ``data.on_bad_image`` to an :class:`ImagePreprocess` hook.

    Other hooks (and None) are returned unchanged.
    """
    if not isinstance(hook, ImagePreprocess):
        return hook
    changes = {"on_bad_image": data.on_bad_image}
    if data.image_size:
        changes["image_size"] = tuple(data.image_size)
    return dataclasses.replace(hook, **changes, _state={})


def valid_image_mask(data):
    """In-graph: True where the bytes look like a whole JPEG, PNG, GIF or BMP image.

    A cheap structural check (signature and end marker) that catches what ``decode_image`` would
    fail on in practice: empty or non-image bytes and truncated files.
    """
    import tensorflow as tf

    n = tf.strings.length(data)

    def head(k):
        return tf.strings.substr(data, 0, k)

    def tail(k):  # position and length must have one shape: one per image
        return tf.strings.substr(data, tf.maximum(n - k, 0), tf.fill(tf.shape(n), k))

    jpeg = tf.equal(head(3), b"\xff\xd8\xff") & tf.equal(tail(2), b"\xff\xd9")
    png = tf.equal(head(8), b"\x89PNG\r\n\x1a\n") & tf.equal(
        tf.strings.substr(tail(8), 0, 4), b"IEND"
    )
    gif = tf.equal(head(4), b"GIF8") & tf.equal(tail(1), b";")
    bmp = tf.equal(head(2), b"BM")
    return (jpeg | png | gif | bmp) & (n > 12)


def check_image_bytes(values: Sequence[bytes]) -> np.ndarray:
    """The same structural check as :func:`valid_image_mask`, in numpy, for a row group."""
    out = np.zeros(len(values), dtype=bool)
    for i, b in enumerate(values):
        if b is None or len(b) <= 12:
            continue
        out[i] = (
            (b[:3] == b"\xff\xd8\xff" and b[-2:] == b"\xff\xd9")
            or (b[:8] == b"\x89PNG\r\n\x1a\n" and b[-8:-4] == b"IEND")
            or (b[:4] == b"GIF8" and b[-1:] == b";")
            or b[:2] == b"BM"
        )
    return out


def locate_bad_images(snapshot, column: str, limit: int = 5) -> list[tuple[str, int, int]]:
    """``(file, row_group, row)`` of up to ``limit`` undecodable images in ``column``.

    Runs only after a failure: a structural check first, then TensorFlow's own decoder, so it
    finds exactly what stopped the pipeline.
    """
    import pyarrow.parquet as pq
    import tensorflow as tf

    found = []
    for path in snapshot.files:
        pf = pq.ParquetFile(path, page_checksum_verification=True)
        for rg in range(pf.num_row_groups):
            values = pf.read_row_group(rg, columns=[column]).column(0).to_pylist()
            ok = check_image_bytes(values)
            for row in np.flatnonzero(~ok):
                found.append((path, rg, int(row)))
            for row in np.flatnonzero(ok):
                try:
                    tf.io.decode_image(values[row], expand_animations=False)
                except (tf.errors.InvalidArgumentError, tf.errors.UnknownError):
                    found.append((path, rg, int(row)))
            if len(found) >= limit:
                return found[:limit]
    return found


def bad_image_error(snapshot, column: str, exc: BaseException) -> DataError:
    """A DataError naming where the undecodable images of ``column`` are."""
    where = locate_bad_images(snapshot, column)
    listed = "; ".join(f"file {f!r}, row group {rg}, row {r}" for f, rg, r in where)
    return DataError(
        f"Column {column!r} of table {snapshot.uri!r} holds undecodable image bytes (not a whole "
        f"JPEG/PNG/GIF/BMP): {listed or 'not found on a re-scan: ' + str(exc)[:200]}. Fix or "
        "remove those rows, or set data.on_bad_image=skip to drop and count them."
    )


def _augment(images):
    import tensorflow as tf

    shape = tf.shape(images)
    n, h, w = shape[0], shape[1], shape[2]
    images = tf.image.random_flip_left_right(images)
    # One random crop box per image (80-100% of the area, any position), resized back.
    scale = tf.sqrt(tf.random.uniform((n, 1), 0.8, 1.0))
    top_left = tf.random.uniform((n, 2)) * (1.0 - scale)
    boxes = tf.concat([top_left, top_left + scale], axis=1)
    images = tf.image.crop_and_resize(images, boxes, tf.range(n), (h, w))
    brightness = tf.random.uniform((n, 1, 1, 1), -0.1, 0.1) * 255.0
    contrast = tf.random.uniform((n, 1, 1, 1), 0.9, 1.1)
    mean = tf.reduce_mean(images, axis=(1, 2, 3), keepdims=True)
    return tf.clip_by_value((images - mean) * contrast + mean + brightness, 0.0, 255.0)


def _normalize(images, how: str, channels: int):
    import tensorflow as tf

    if how == "unit":
        return images / 255.0
    if how == "symmetric":
        return images / 127.5 - 1.0
    if how == "imagenet":
        mean, std = np.array(_IMAGENET_MEAN), np.array(_IMAGENET_STD)
        if channels == 1:  # grey: the luminance-weighted ImageNet statistics
            mean, std = mean.mean(keepdims=True), std.mean(keepdims=True)
        return (images / 255.0 - tf.constant(mean, tf.float32)) / tf.constant(std, tf.float32)
    return images
