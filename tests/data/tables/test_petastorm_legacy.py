"""Datasets written by Petastorm 0.4-0.7 read on pyspark 4, through the restricted unpickler.

Those releases ran on a pyspark whose namedtuple "hijack" pickled each ``UnischemaField`` as
``pyspark.serializers._restore(name, fields, values)``; pyspark 4 removed ``_restore``. The
pickles here are built the same way (protocol 0, as Python 2 wrote them) and planted in the
``_common_metadata`` of a Parquet folder.
"""

from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from keras_dl.data import open_table
from keras_dl.data.tables.petastorm_meta import UNISCHEMA_KEY, loads_unischema, trusting
from keras_dl.errors import DataError

ROWS = 6


def _restore(name, fields, values):  # pickled by reference, then renamed to pyspark's
    raise AssertionError("never called: the pickle names pyspark.serializers._restore")


def legacy_pickle(schema, name: str = "UnischemaField") -> bytes:
    """``pickle.dumps(schema, 0)`` with every field pickled as pyspark < 4 pickled namedtuples."""
    from petastorm.unischema import UnischemaField

    class Pickler(pickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, UnischemaField):
                return _restore, (name, tuple(obj._fields), tuple(obj))
            return NotImplemented

    buffer = io.BytesIO()
    Pickler(buffer, protocol=0).dump(schema)
    here = f"c{__name__}\n_restore\n".encode()
    data = buffer.getvalue()
    assert here in data
    return data.replace(here, b"cpyspark.serializers\n_restore\n")


@pytest.fixture
def legacy_dataset(tmp_path):
    """A Parquet folder with a 0.4-0.7-style Unischema: an id, a name and a 2x3 matrix."""
    from petastorm.codecs import NdarrayCodec, ScalarCodec
    from petastorm.unischema import Unischema, UnischemaField
    from pyspark.sql.types import LongType, StringType

    schema = Unischema(
        "Legacy",
        [
            UnischemaField("id", np.int64, (), ScalarCodec(LongType()), False),
            UnischemaField("name", np.str_, (), ScalarCodec(StringType()), False),
            UnischemaField("matrix", np.float32, (2, 3), NdarrayCodec(), False),
        ],
    )
    field = schema.fields["matrix"]
    table = pa.table(
        {
            "id": np.arange(ROWS),
            "name": [f"n{i}" for i in range(ROWS)],
            "matrix": [
                bytes(NdarrayCodec().encode(field, np.full((2, 3), i, np.float32)))
                for i in range(ROWS)
            ],
        }
    )
    pq.write_table(table, tmp_path / "part-0.parquet", row_group_size=3)
    row_groups = json.dumps({"part-0.parquet": 2}).encode()  # as materialize_dataset writes it
    meta = table.schema.with_metadata(
        {
            UNISCHEMA_KEY: legacy_pickle(schema),
            b"dataset-toolkit.num_row_groups_per_file.v1": row_groups,
        }
    )
    pq.write_metadata(meta, tmp_path / "_common_metadata")
    return tmp_path


def test_petastorms_make_reader_reads_a_0_7_dataset(legacy_dataset):
    from petastorm import make_reader

    with make_reader(f"file://{legacy_dataset}", reader_pool_type="dummy", num_epochs=1) as r:
        rows = sorted(r, key=lambda row: row.id)
    assert [row.id for row in rows] == list(range(ROWS))
    assert rows[4].name == "n4"
    np.testing.assert_array_equal(rows[4].matrix, np.full((2, 3), 4, np.float32))


def test_keras_dl_opens_it_with_and_without_trust(legacy_dataset):
    from petastorm.unischema import UnischemaField

    snapshot = open_table(str(legacy_dataset))
    assert snapshot.format == "petastorm"
    fields = snapshot.unischema.fields
    assert list(fields) == ["id", "name", "matrix"]
    assert type(fields["matrix"]) is UnischemaField and fields["matrix"].shape == (2, 3)
    with trusting():  # Petastorm's own loader, given the same _restore
        assert open_table(str(legacy_dataset)).unischema.fields == fields


@pytest.mark.parametrize("trust", [False, True])
def test_another_pyspark_namedtuple_is_refused_with_the_fix(tmp_path, trust):
    from petastorm.unischema import Unischema, UnischemaField

    schema = Unischema("Odd", [UnischemaField("x", np.int32, (), None, False)])
    with pytest.raises(DataError) as excinfo:
        loads_unischema(legacy_pickle(schema, name="Row"), str(tmp_path), trust=trust)
    message = str(excinfo.value)
    assert str(tmp_path) in message and "Row" in message
    assert f"petastorm-generate-metadata --dataset_url {tmp_path}" in message
