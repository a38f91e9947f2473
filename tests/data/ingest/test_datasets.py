"""`keras-dl ingest tfds|images`: real TFDS loading code (on tfds.testing.mock_data) and image trees."""

import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from keras_dl.cli import main
from keras_dl.config import DataConfig
from keras_dl.data import make_splits, open_table
from keras_dl.data.ingest.datasets import assign_splits, rows_per_group_for
from keras_dl.data.ingest.images import ingest_images
from keras_dl.data.ingest.tfds import ingest_tfds
from keras_dl.data.tables.images import make_image_preprocess
from keras_dl.errors import DataError


def _rows(path):
    snap = open_table(path)
    return pq.ParquetDataset(list(snap.files)).read().to_pandas(), snap


def test_tfds_image_dataset_is_stored_encoded_with_labels_and_resplit(tmp_path, capsys):
    import tensorflow_datasets as tfds

    to = str(tmp_path / "flowers")
    with tfds.testing.mock_data(num_examples=40):
        status = main(
            ["ingest", "tfds", "tf_flowers", "--to", to, "--split", "train"]
            + ["--resplit", "0.5,0.25,0.25", "--rows-per-group", "8"]
        )
    assert status == 0
    out = capsys.readouterr().out
    assert "version 0: 40 rows" in out and "row group(s)" in out
    df, snap = _rows(to)
    assert snap.partition_columns == ("split",)
    assert set(df.columns) >= {"image", "label", "label_name", "split"}
    assert sorted(df.split.value_counts().tolist()) == [10, 10, 20]
    names = tfds.builder("tf_flowers").info.features["label"].names
    assert all(names[lab] == n for lab, n in zip(df.label, df.label_name))
    assert all(
        isinstance(b, bytes) and b[:4] in (b"\x89PNG", b"\xff\xd8\xff\xe0") for b in df.image
    )
    # The stored bytes go through the image hook end to end.
    data = make_splits(
        DataConfig(table=to, features=("image",), split_column="split"),
        batch_size=4,
        accept=("binary",),
        preprocess=make_image_preprocess("image", (16, 16)),
    )
    x, y = next(iter(data.train.dataset))
    assert x.shape == (4, 16, 16, 3) and y.dtype.name == "int64"
    assert data.train.stats.rows == 20 and data.train.steps == 5


def test_tfds_tensor_features_become_dense_list_columns(tmp_path):
    import tensorflow_datasets as tfds

    to = str(tmp_path / "iris")
    with tfds.testing.mock_data(num_examples=30):
        report = ingest_tfds("iris", to, splits=["train"], rows_per_group=10)
    assert report.rows == 30 and report.row_groups == 3
    data = make_splits(DataConfig(table=to, features=("features",)), batch_size=5)
    x, y = next(iter(data.train.dataset))
    assert x.shape == (5, 4) and x.dtype.name == "float32"


def test_tfds_unknown_or_unprepared_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match=r"TFDS has no dataset 'no_such_dataset_xyz'.*catalog"):
        ingest_tfds("no_such_dataset_xyz", str(tmp_path / "t"))
    # No network here: preparing a real dataset fails, and the message says what to do.
    with pytest.raises(DataError, match=r"'iris'.*(could not be downloaded|pip install)"):
        ingest_tfds("iris", str(tmp_path / "t"), data_dir=str(tmp_path / "tfds"))
    assert not os.path.exists(tmp_path / "t" / "_delta_log")


def _tree(root, layout=("cat", "dog"), per_class=6, junk=True):
    import cv2

    for c, cls in enumerate(layout):
        os.makedirs(root / cls, exist_ok=True)
        for i in range(per_class):
            img = np.full((10 + i, 12, 3), 40 * c + i, dtype=np.uint8)
            ext = ".jpg" if i % 2 else ".png"
            cv2.imwrite(str(root / cls / f"{i}{ext}"), img)
    if not junk:
        return root
    (root / layout[0] / "notes.txt").write_text("not an image")
    (root / layout[0] / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    return root


def test_image_tree_is_ingested_as_bytes_labels_and_names(tmp_path, capsys):
    root = _tree(tmp_path / "photos")
    to = str(tmp_path / "t")
    assert main(["ingest", "images", str(root), "--to", to, "--rows-per-group", "4"]) == 0
    out = capsys.readouterr().out
    assert "12 rows" in out and "2 classes: cat, dog" in out
    assert "skipped 1 file(s)" in out and "broken.jpg" in out
    df, snap = _rows(to)
    assert snap.partition_columns == ()
    assert sorted(df.label_name.unique()) == ["cat", "dog"]
    assert (df.label == (df.label_name == "dog").astype(int)).all()
    one = df[df.path == os.path.join("dog", "3.jpg")].image.iloc[0]
    assert one == (root / "dog" / "3.jpg").read_bytes()
    # A second ingest into the same table stops unless told what to do.
    assert main(["ingest", "images", str(root), "--to", to]) == 2
    # One paragraph, wrapped: where its lines break depends on the length of tmp_path.
    assert "already exists" in " ".join(capsys.readouterr().err.split())


def test_image_tree_with_split_folders_or_resplit(tmp_path):
    root = tmp_path / "tree"
    _tree(root / "train", per_class=4)
    _tree(root / "val", per_class=2)
    report = ingest_images(str(root), str(tmp_path / "a"), rows_per_group=4)
    df, snap = _rows(str(tmp_path / "a"))
    assert snap.partition_columns == ("split",)
    assert df.split.value_counts().to_dict() == {"train": 8, "validation": 4}
    assert report.classes == ["cat", "dog"] and len(report.skipped) == 2

    flat = _tree(tmp_path / "flat", per_class=10, junk=False)
    ingest_images(str(flat), str(tmp_path / "b"), resplit=(0.6, 0.2, 0.2))
    df, _ = _rows(str(tmp_path / "b"))
    assert df.groupby(["split", "label_name"]).size().to_dict() == {
        (s, c): n for s, n in (("test", 2), ("train", 6), ("validation", 2)) for c in ("cat", "dog")
    }


def test_missing_or_empty_image_folder_says_what_layout_is_expected(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        ingest_images(str(tmp_path / "nope"), str(tmp_path / "t"))
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(DataError, match=r"DIR/<class>/<image>"):
        ingest_images(str(tmp_path / "empty"), str(tmp_path / "t"))


def test_split_assignment_and_row_group_sizing():
    labels = np.repeat([0, 1, 2], 20)
    a = assign_splits(labels, (0.7, 0.15, 0.15), seed=3)
    assert (a == assign_splits(labels, (0.7, 0.15, 0.15), seed=3)).all()
    for lab in range(3):
        assert sorted(a[labels == lab].tolist()).count("train") == 14
    with pytest.raises(DataError, match="sum to 1"):
        assign_splits(labels, (0.5, 0.1, 0.1))
    assert rows_per_group_for(100_000) == 128  # ~100 kB JPEGs -> ~13 MB groups
    assert rows_per_group_for(16) == 16384 and rows_per_group_for(10**9) == 64


def test_ingest_append_reports_the_version_it_committed_when_another_writer_follows(
    tmp_path, capsys, monkeypatch
):
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    to = str(tmp_path / "digits")
    assert main(["ingest", "sklearn-digits", "--to", to]) == 0  # version 0: 1797 rows
    own_commit = DeltaTable.create_write_transaction  # how ingest commits to a table
    other = pa.table(
        {
            "pixels": pa.array([[0.0] * 64], pa.list_(pa.float32())),
            "label": pa.array([1], pa.int64()),
            "split": ["train"],
        }
    )

    def and_then_another_writer_appends(*args, **kwargs):
        own_commit(*args, **kwargs)  # the ingest's commit: version 1
        write_deltalake(to, other, mode="append", partition_by=["split"])  # a real commit: v2

    monkeypatch.setattr(DeltaTable, "create_write_transaction", and_then_another_writer_appends)
    capsys.readouterr()
    assert main(["ingest", "sklearn-digits", "--to", to, "--mode", "append"]) == 0
    out = capsys.readouterr().out
    assert f"Delta table {to} version 1: 3594 rows" in out  # the table at the ingest's commit
    assert open_table(to).version == 2 and "version 2" not in out
