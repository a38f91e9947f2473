"""Encoded images decoded in tf.data: JPEG and PNG, resize, normalize, augmentation, bad images."""

import numpy as np
import pyarrow as pa
import pytest

from keras_dl.config import DataConfig, Experiment, TrackingConfig, TrainConfig, resolve
from keras_dl.data import ReadOptions, make_dataset, make_splits, open_table, plan_columns
from keras_dl.data.tables.images import ImagePreprocess, make_image_preprocess
from keras_dl.errors import DataError
from keras_dl.recipe import Recipe
from tests.conftest import write_test_table


def _encode(img: np.ndarray, fmt: str) -> bytes:
    import cv2

    ok, buf = cv2.imencode(f".{fmt}", img)
    assert ok
    return buf.tobytes()


def _images(n: int):
    """n smooth images of varying sizes; even rows JPEG (colour), odd rows PNG (some grey)."""
    raw, encoded = [], []
    for i in range(n):
        h, w = 20 + (i % 3) * 4, 24 + (i % 2) * 8
        base = np.full((h, w, 3), (i * 17) % 200 + 20, dtype=np.uint8)
        base[:, : w // 2, 0] = 250  # a red left half, to check flips and channel order
        raw.append(base)
        if i % 2 == 0:
            encoded.append(_encode(base, "jpg"))
        elif i % 4 == 1:
            encoded.append(_encode(base, "png"))
        else:
            encoded.append(_encode(base.max(axis=2), "png"))  # grayscale PNG -> 3 channels
    return raw, encoded


def _write(path, encoded, splits=None, rows_per_group=8):
    n = len(encoded)
    cols = {"image": pa.array(encoded, pa.binary()), "label": np.arange(n, dtype=np.int64) % 2}
    if splits is not None:
        cols["split"] = splits
    write_test_table(
        path,
        pa.table(cols),
        rows_per_group,
        rows_per_file=4 * rows_per_group,
        partition_by=["split"] if splits is not None else None,
    )
    return path


def _splits(path, hook, train_hook=None, **data):
    return make_splits(
        DataConfig(table=path, features=("image",), shuffle=False, **data),
        batch_size=8,
        accept=("binary",),
        preprocess=hook,
        preprocess_train=train_hook,
    )


def test_jpeg_and_png_are_decoded_resized_and_normalized(tmp_path):
    raw, encoded = _images(24)
    path = _write(str(tmp_path / "t"), encoded)
    data = _splits(path, make_image_preprocess("image", (16, 12)))
    x, y = next(iter(data.validation.dataset if data.validation else data.train.dataset))
    assert x.shape == (8, 16, 12, 3) and x.dtype.name == "float32" and y.shape == (8,)
    x = x.numpy()
    assert x.min() >= 0.0 and x.max() <= 1.0
    # OpenCV encodes BGR: channel 0 of the source (250 on the left) is blue after decoding.
    assert np.all(x[:, :, :3, 2] > 0.9)
    assert np.all(x[:, :, -3:, 2] < 0.9)


def test_config_overrides_the_hook_size_and_normalization_modes(tmp_path):
    _, encoded = _images(16)
    path = _write(str(tmp_path / "t"), encoded)
    data = _splits(path, make_image_preprocess("image", (16, 16)), image_size=(8, 10))
    x, _ = next(iter(data.train.dataset))
    assert x.shape == (8, 8, 10, 3)
    sym = _splits(path, make_image_preprocess("image", (8, 8), normalize="symmetric"))
    x, _ = next(iter(sym.train.dataset))
    assert x.numpy().min() < 0.0 and x.numpy().max() <= 1.0


def test_augmentation_runs_on_the_training_split_only(tmp_path):
    _, encoded = _images(32)
    splits = np.array(["train", "validation"] * 16, dtype=object)
    path = _write(str(tmp_path / "t"), encoded, splits=pa.array(splits.tolist()))
    plain = make_image_preprocess("image", (16, 16))
    aug = make_image_preprocess("image", (16, 16), augment=True)
    data = _splits(path, plain, aug, split_column="split")
    # Validation batches are identical on every pass; training batches are not.
    v1 = next(iter(data.validation.dataset))[0].numpy()
    v2 = next(iter(data.validation.dataset))[0].numpy()
    np.testing.assert_array_equal(v1, v2)
    t = [x.numpy() for x, _ in data.train.dataset.take(4)]
    assert t[0].shape == v1.shape
    assert not any(np.array_equal(t[0], t[k]) for k in (2,))  # second epoch, same rows
    ref = _splits(path, plain, split_column="split")
    t_plain = next(iter(ref.train.dataset))[0].numpy()
    assert not np.allclose(t[0], t_plain)


def _with_bad_rows(n=24, bad=(3, 10, 17)):
    _, encoded = _images(n)
    for i in bad:
        encoded[i] = b"not an image" if i % 2 else encoded[i][: len(encoded[i]) // 2]
    return encoded, bad


@pytest.mark.parametrize("cache", ["auto", "never"])  # the hook in the generator, in tf.data
def test_undecodable_image_fails_naming_file_row_group_and_row(tmp_path, cache):
    encoded, bad = _with_bad_rows()
    path = _write(str(tmp_path / "t"), encoded)
    data = _splits(path, make_image_preprocess("image", (8, 8)), cache=cache)
    with pytest.raises(DataError) as info:
        for _ in data.train.batches():  # one epoch
            pass
    msg = str(info.value)
    assert "Column 'image'" in msg and "row group" in msg and ".parquet" in msg
    assert "data.on_bad_image=skip" in msg
    # 8 rows per group: row 3 is row group 0, row 3 of the first file.
    assert "row group 0, row 3" in msg


def test_skip_policy_drops_and_counts_bad_images(tmp_path):
    encoded, bad = _with_bad_rows()
    path = _write(str(tmp_path / "t"), encoded)
    snap = open_table(path)
    plan = plan_columns(snap, ("image",), "label", accept=("binary",))
    hook = make_image_preprocess("image", (8, 8), on_bad_image="skip")
    split = make_dataset(snap, plan, ReadOptions(batch_size=8), hook)  # one pass
    rows = sum(int(x.shape[0]) for x, _ in split.dataset)
    assert rows == 24 - len(bad) and hook.skipped() == len(bad)
    # Training: a skipped image leaves its batch one row short (batches never cross an epoch),
    # and the count grows with every read.
    data = _splits(path, make_image_preprocess("image", (8, 8)), on_bad_image="skip")
    kept = [int(x.shape[0]) for x, _ in data.train.dataset.take(2 * data.train.steps)]
    assert all(0 < k <= 8 for k in kept) and sum(kept) < 2 * data.train.stats.rows
    assert data.bad_images_skipped() >= len(bad)


def test_invalid_hook_settings_are_rejected():
    with pytest.raises(DataError, match="on_bad_image"):
        ImagePreprocess(on_bad_image="ignore")
    with pytest.raises(DataError, match="normalize"):
        ImagePreprocess(normalize="zscore")


@pytest.mark.slow
def test_fit_logs_the_skipped_count_to_mlflow(tmp_path, mlflow_uri):
    import mlflow

    from keras_dl.train import fit

    encoded, bad = _with_bad_rows(32, bad=(5,))
    path = _write(str(tmp_path / "t"), encoded)

    def build(data, exp):
        import keras

        inputs = keras.Input((8, 8, 3))
        x = keras.layers.GlobalAveragePooling2D()(inputs)
        return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(x))

    exp = resolve(
        Experiment(
            recipe="tiny_images",
            data=DataConfig(table=path, features=("image",), on_bad_image="skip"),
            train=TrainConfig(epochs=1, batch_size=8, verbose=0),
            tracking=TrackingConfig(uri=mlflow_uri, log_model=False),
        ),
        sets=[f"runtime.run_dir={tmp_path / 'run'}"],
    )
    recipe = Recipe(
        name="tiny_images",
        description="test",
        defaults=exp,
        build_model=build,
        accept=("binary",),
        preprocess=make_image_preprocess("image", (8, 8)),
    )
    result = fit(exp, recipe)
    run = mlflow.MlflowClient(mlflow_uri).get_run(result.run_id)
    assert run.data.metrics["data.bad_images_skipped"] >= 1
