"""No code from data: planted Unischema pickles never run, genuine Petastorm datasets still read.

Each payload is a real pickle whose reduce would touch a marker file. It is planted where
Petastorm looks for a Unischema (``_common_metadata``, or ``_metadata``, which pyarrow uses when
there is no ``_common_metadata``) in a plain Parquet folder, a copy of a real Petastorm dataset
and a Delta table, then opened through keras_dl and through Petastorm's own readers.
"""

from __future__ import annotations

import builtins
import os
import pickle
import shutil
import subprocess
import time
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from keras_dl.data import open_table, petastorm_compat
from keras_dl.data.tables.petastorm import open_petastorm
from keras_dl.data.tables.petastorm_meta import (
    UNISCHEMA_KEY,
    loads_unischema,
    read_unischema,
    trusting,
)
from keras_dl.errors import DataError


class Call:
    """Pickles as ``func(*args)``: what a hostile ``_common_metadata`` would hold."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def payloads(marker: str) -> dict[str, tuple[object, str]]:
    """``{name: (object to pickle, the global the restricted loader must refuse)}``."""
    from numpy.testing._private.utils import runstring
    from petastorm.unischema import Unischema, UnischemaField

    touch = f"open({marker!r}, 'w').close()"
    nested = Unischema("Looks", [UnischemaField("x", np.int32, (), Call(exec, touch), False)])
    return {
        "os.system": (Call(os.system, f"touch {marker}"), f"{os.system.__module__}.system"),
        "exec": (Call(exec, touch), "builtins.exec"),
        "eval": (
            Call(builtins.eval, f"__import__('os').system('touch {marker}')"),
            "builtins.eval",
        ),
        "subprocess.Popen": (Call(subprocess.Popen, ["touch", marker]), "subprocess.Popen"),
        # numpy.testing's exec helper: Petastorm's own loader allows all of numpy.
        "numpy runstring": (Call(runstring, touch, {}), "numpy.testing._private.utils.runstring"),
        "exec inside a Unischema": (nested, "builtins.exec"),
    }


PAYLOADS = list(payloads("m"))
PROTOCOLS = [0, pickle.DEFAULT_PROTOCOL]


def plant(folder, payload: bytes, name: str = "_common_metadata") -> None:
    """Write a Parquet metadata file whose key-value metadata holds ``payload`` as the Unischema."""
    schema = pa.schema([("x", pa.int32())]).with_metadata({UNISCHEMA_KEY: payload})
    pq.write_metadata(schema, os.path.join(folder, name))


def swap_unischema(folder, payload: bytes) -> None:
    """Replace only the Unischema of a real ``_common_metadata``, keeping its other keys."""
    meta = pq.read_metadata(os.path.join(folder, "_common_metadata"))
    kv = {**meta.metadata, UNISCHEMA_KEY: payload}
    schema = meta.schema.to_arrow_schema().with_metadata(kv)
    pq.write_metadata(schema, os.path.join(folder, "_common_metadata"))


def wait_absent(marker: str) -> None:
    """Fail if the marker appears (give a spawned process a moment to create it)."""
    for _ in range(10):
        assert not os.path.exists(marker), "the planted payload ran"
        time.sleep(0.05)


def check_refused(error: Exception, folder, refused: str) -> None:
    """The error names the dataset folder, the refused global and the opt-in."""
    message = str(error)
    assert os.path.abspath(folder) in message, message
    assert refused in message, message
    assert "data.trust_petastorm_metadata=true" in message, message


@pytest.fixture
def marker(tmp_path):
    return str(tmp_path / "MARKER")


@pytest.fixture
def parquet_folder(tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    pq.write_table(pa.table({"x": pa.array([1, 2, 3], pa.int32())}), folder / "part-0.parquet")
    return folder


@pytest.fixture
def delta_folder(tmp_path):
    from keras_dl.data.ingest.datasets import write_table

    folder = tmp_path / "delta"
    write_table(pa.table({"x": pa.array([1, 2, 3], pa.int32())}), str(folder))
    return folder


@pytest.mark.parametrize("name", PAYLOADS)
def test_every_payload_is_live_under_petastorms_own_or_a_plain_unpickler(name, marker):
    # The control: without keras_dl's loader these pickles do run (so the tests below can fail).
    from petastorm.etl.legacy import restricted_loads

    obj, refused = payloads(marker)[name]
    data = pickle.dumps(obj)
    module = refused.split(".")[0]
    if module in ("builtins", "numpy"):  # Petastorm 0.13.1 allows both packages whole
        restricted_loads(data)
    else:
        pickle.loads(data)
    for _ in range(40):
        if os.path.exists(marker):
            break
        time.sleep(0.05)
    assert os.path.exists(marker)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("name", PAYLOADS)
@pytest.mark.parametrize("where", ["plain", "delta"])
def test_open_table_never_runs_a_planted_unischema(
    where, name, protocol, marker, parquet_folder, delta_folder
):
    folder = parquet_folder if where == "plain" else delta_folder
    obj, refused = payloads(marker)[name]
    plant(folder, pickle.dumps(obj, protocol=protocol))
    try:
        snapshot = open_table(str(folder))
    except DataError as exc:
        check_refused(exc, folder, refused)
    else:  # a Delta table is read as Delta, never through its _common_metadata
        assert where == "delta" and snapshot.format == "delta"
    wait_absent(marker)


@pytest.mark.parametrize("name", PAYLOADS)
@pytest.mark.parametrize("where", ["plain", "delta", "_metadata"])
@pytest.mark.parametrize("make", ["make_reader", "make_batch_reader"])
def test_petastorms_own_readers_refuse_a_planted_unischema_after_install(
    make, where, name, marker, parquet_folder, delta_folder
):
    import petastorm

    petastorm_compat.install()
    folder = delta_folder if where == "delta" else parquet_folder
    obj, refused = payloads(marker)[name]
    plant(folder, pickle.dumps(obj), "_metadata" if where == "_metadata" else "_common_metadata")
    with pytest.raises(DataError) as excinfo, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reader = getattr(petastorm, make)(f"file://{folder}", reader_pool_type="dummy")
        reader.stop()
    check_refused(excinfo.value, folder, refused)
    wait_absent(marker)


def test_legacy_package_names_are_renamed_as_petastorm_does(tmp_path):
    from petastorm.codecs import ScalarCodec
    from petastorm.unischema import Unischema, UnischemaField
    from pyspark.sql.types import LongType

    schema = Unischema("Old", [UnischemaField("y", np.int64, (), ScalarCodec(LongType()), False)])
    data = pickle.dumps(schema, protocol=0)
    assert b"cpetastorm.unischema\n" in data
    legacy = data.replace(b"cpetastorm.", b"cav.ml.dataset_toolkit.")
    loaded = loads_unischema(legacy, str(tmp_path))
    assert list(loaded.fields) == ["y"] and loaded.fields["y"].codec.spark_dtype() == LongType()
    with trusting():  # Petastorm's own loader after its own byte rewrite
        assert list(loads_unischema(legacy, str(tmp_path)).fields) == ["y"]


def test_a_pickle_that_is_not_a_unischema_is_refused(parquet_folder):
    plant(parquet_folder, pickle.dumps({"not": "a schema"}))
    with pytest.raises(DataError, match="not a Unischema"):
        read_unischema(str(parquet_folder))


# -- a genuine Petastorm dataset, written by Spark with materialize_dataset ---------------------


@pytest.fixture(scope="module")
def genuine(spark, tmp_path_factory):
    import decimal

    from petastorm.codecs import CompressedImageCodec, NdarrayCodec, ScalarCodec
    from petastorm.etl.dataset_metadata import materialize_dataset
    from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row
    from pyspark.sql.types import DecimalType, LongType, StringType

    schema = Unischema(
        "Genuine",
        [
            UnischemaField("image", np.uint8, (4, 4, 3), CompressedImageCodec("png"), False),
            UnischemaField("vec", np.float32, (3,), NdarrayCodec(), False),
            UnischemaField("label", np.int64, (), ScalarCodec(LongType()), False),
            UnischemaField("name", np.str_, (), ScalarCodec(StringType()), False),
            UnischemaField("price", decimal.Decimal, (), ScalarCodec(DecimalType(6, 2)), True),
        ],
    )
    url = "file://" + str(tmp_path_factory.mktemp("petastorm_meta") / "genuine")
    with materialize_dataset(spark, url, schema, row_group_size_mb=1):
        rows = [
            dict_to_spark_row(
                schema,
                {
                    "image": np.full((4, 4, 3), i, np.uint8),
                    "vec": np.full(3, i, np.float32),
                    "label": i,
                    "name": f"n{i}",
                    "price": decimal.Decimal(f"{i}.25"),
                },
            )
            for i in range(12)
        ]
        spark.createDataFrame(rows, schema.as_spark_schema()).repartition(2).write.parquet(url)
    return url[len("file://") :]


@pytest.mark.slow
def test_a_genuine_dataset_reads_through_the_restricted_loader_without_opt_in(genuine):
    import petastorm

    snapshot = open_table(genuine)
    assert snapshot.format == "petastorm"
    assert list(snapshot.unischema.fields) == ["image", "vec", "label", "name", "price"]
    petastorm_compat.install()
    with petastorm.make_reader(f"file://{genuine}", reader_pool_type="dummy", num_epochs=1) as r:
        rows = sorted(r, key=lambda row: row.label)
    assert [row.label for row in rows] == list(range(12))
    assert rows[3].image.shape == (4, 4, 3) and str(rows[3].price) == "3.25"


@pytest.mark.slow
def test_a_genuine_dataset_reads_with_trust_too(genuine):
    assert list(open_petastorm(genuine, trust=True).unischema.fields)[0] == "image"
    with trusting():
        assert open_table(genuine).unischema.fields["label"].numpy_dtype is np.int64


@pytest.mark.slow
@pytest.mark.parametrize("name", ["os.system", "exec", "subprocess.Popen"])
def test_a_copy_of_a_real_dataset_with_a_planted_unischema_never_runs_it(
    name, genuine, tmp_path, marker
):
    import petastorm

    folder = tmp_path / "looks_real"
    shutil.copytree(genuine, folder)
    obj, refused = payloads(marker)[name]
    swap_unischema(folder, pickle.dumps(obj))
    with pytest.raises(DataError) as excinfo:
        open_table(str(folder))
    check_refused(excinfo.value, folder, refused)
    petastorm_compat.install()
    with pytest.raises(DataError) as excinfo:
        petastorm.make_reader(f"file://{folder}", reader_pool_type="dummy")
    check_refused(excinfo.value, folder, refused)
    wait_absent(marker)


@pytest.mark.slow
def test_keras_dls_row_reader_reuses_the_vetted_unischema(genuine, tmp_path, marker):
    from keras_dl.data import plan_columns
    from keras_dl.data.stream.shard_epochs import iter_epoch_arrays
    from keras_dl.data.tables.stats import scan_table

    folder = tmp_path / "swapped"
    shutil.copytree(genuine, folder)
    snapshot = open_table(str(folder))
    # Swapped after opening: make_reader must not unpickle the file again.
    swap_unischema(folder, pickle.dumps(Call(os.system, f"touch {marker}")))
    plan = plan_columns(snapshot, ("vec",), "label")
    stats = scan_table(snapshot, plan.columns)
    chunks = list(iter_epoch_arrays(snapshot, plan, stats, shuffle=False, workers=1))
    assert sorted(int(v) for c in chunks for v in c["label"]) == list(range(12))
    wait_absent(marker)
