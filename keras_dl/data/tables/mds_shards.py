"""One MDS shard (Mosaic StreamingDataset, format version 2) -> a ``pyarrow.Table``. No I/O here.

Written from the format as ``mosaicml-streaming`` writes it (``streaming/base/format/mds``):
a shard is ``[samples: u32][offsets: (samples + 1) x u32][config][samples' bytes]``, possibly
compressed whole (``compression`` in ``index.json``). Each sample is the sizes (u32) of its
variable-size columns, then every column's bytes in the index's column order.

Column encodings become Arrow types: scalars their width (``int`` is int64), ``str`` and
``json`` strings (``json`` keeps its text), ``bytes`` binary, ``jpeg``/``png`` the encoded image
bytes (decoded in tf.data, :mod:`keras_dl.data.tables.images`), ``str_int``/``str_float``
int64/float64, ``str_decimal`` its text, ``ndarray`` a list of its dtype, flattened: a fixed
size list for a static shape; for a shape each sample stores, the shape goes in a column
``<name>__shape``. ``pkl`` is refused, never unpickled: nothing read from data runs as code.
"""

from __future__ import annotations

import bz2
import gzip
import json
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from keras_dl.errors import DataError

SHAPE_SUFFIX = "__shape"  # the companion column of an ndarray whose shape each sample stores

_SCALARS = {
    "int": "int64",
    **{n: n for n in ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32")},
    **{n: n for n in ("int64", "float16", "float32", "float64")},
}
_VALUE_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32"}
_VALUE_DTYPES.update({33: "int32", 34: "float32", 64: "uint64", 65: "int64", 66: "float64"})
_SHAPE_DTYPES = ("uint8", "uint16", "uint32", "uint64")
_TEXT = {"str": pa.string(), "json": pa.string(), "str_decimal": pa.string()}
_BINARY = ("bytes", "jpeg", "png")
_OTHER = {"str_int": pa.int64(), "str_float": pa.float64()}


def decompressor(compression: str | None, where: str) -> Callable[[bytes, int], bytes]:
    """``fn(data, raw size) -> raw bytes`` for a shard compression of ``index.json``.

    zstd through ``zstandard`` when installed, else pyarrow's codec; gz and bz2 through the
    standard library; br and snappy through pyarrow's codecs (the raw Brotli stream and the
    Snappy block the library writes). Anything else is a DataError naming it.
    """
    if not compression:
        return lambda data, size: data
    family = compression.split(":", 1)[0]
    if family == "gz":
        return lambda data, size: gzip.decompress(data)
    if family == "bz2":
        return lambda data, size: bz2.decompress(data)
    if family == "zstd":
        try:
            import zstandard
        except ImportError:
            zstandard = None
        if zstandard is not None:
            return lambda data, size: zstandard.ZstdDecompressor().decompress(data, size)
    codec = {"zstd": "zstd", "br": "brotli", "snappy": "snappy"}.get(family)
    if codec is None or not pa.Codec.is_available(codec):
        raise DataError(
            f"{where} is compressed with {compression!r}, which keras_dl cannot decompress "
            "(it reads zstd, gz, bz2, br and snappy, the last ones when pyarrow was built with "
            "them). Re-write the dataset with another compression, or none."
        )
    return lambda data, size: pa.Codec(codec).decompress(data, size, asbytes=True)


def arrow_fields(
    names: Sequence[str], encodings: Sequence[str], where: str, dtypes: dict | None = None
) -> list[pa.Field]:
    """The Arrow fields the columns decode to (a dynamic-shape ndarray adds its shape column).

    ``dtypes``: the dtype of each ``ndarray`` column whose samples store their own, as the
    dataset's first sample has it (:func:`sample_dtypes`); every sample must have it.

    Raises:
        DataError: For ``pkl`` (refused: unpickling runs code) and any encoding not read here,
            naming the column and ``where`` (the folder).
    """
    fields = []
    for name, encoding in zip(names, encodings):
        family, _, args = encoding.partition(":")
        meta = {b"mds.encoding": encoding.encode()}
        if family == "pkl":
            raise DataError(
                f"Column {name!r} of MDS dataset {where} is encoded with 'pkl' (Python pickle). "
                "keras_dl never unpickles data: unpickling runs code. Re-write that column "
                "with another encoding (ndarray, json, str, bytes, a scalar type) and read "
                "the new folder."
            )
        if encoding in _SCALARS:
            fields.append(pa.field(name, pa.from_numpy_dtype(np.dtype(_SCALARS[encoding]))))
        elif encoding in _TEXT or encoding in _OTHER:
            fields.append(pa.field(name, _TEXT.get(encoding) or _OTHER[encoding]))
        elif encoding in _BINARY:
            fields.append(pa.field(name, pa.binary()))
        elif family == "ndarray":
            dtype, shape = ndarray_args(args, name, where)
            dtype = dtype or (dtypes or {}).get(name, "float32")
            value = pa.from_numpy_dtype(np.dtype(dtype))
            if shape is not None:
                meta[b"mds.shape"] = ",".join(map(str, shape)).encode()
                fields.append(pa.field(name, pa.list_(value, int(np.prod(shape))), metadata=meta))
            else:
                fields.append(pa.field(name, pa.list_(value), metadata=meta))
                shape_meta = {b"mds.shape_of": name.encode()}
                fields.append(
                    pa.field(name + SHAPE_SUFFIX, pa.list_(pa.int64()), metadata=shape_meta)
                )
            continue
        else:
            raise DataError(
                f"Column {name!r} of MDS dataset {where} has encoding {encoding!r}, which "
                "keras_dl does not read (it reads the scalar types, str, bytes, json, "
                "str_int, str_float, str_decimal, ndarray with a dtype, jpeg and png). "
                "Re-write that column with one of those."
            )
        fields[-1] = fields[-1].with_metadata(meta)
    return fields


def ndarray_args(args: str, name: str, where: str) -> tuple[str | None, tuple | None]:
    """``(dtype or None, shape or None)`` of an ``ndarray[:dtype[:shape]]`` encoding."""
    parts = args.split(":") if args else []
    try:
        dtype = parts[0] if parts else None
        shape = tuple(int(d) for d in parts[1].split(",")) if len(parts) > 1 else None
        if dtype is not None and dtype not in _VALUE_DTYPES.values() or len(parts) > 2:
            raise ValueError(dtype)
    except ValueError:
        raise DataError(
            f"Column {name!r} of MDS dataset {where} has encoding 'ndarray:{args}', which is "
            "not an MDS ndarray encoding ('ndarray', 'ndarray:<dtype>', "
            "'ndarray:<dtype>:<d0,d1,...>'). Re-write the dataset with a valid one."
        ) from None
    return dtype, shape


def sample_dtypes(
    data: bytes, names: Sequence[str], encodings: Sequence[str], sizes: Sequence, where: str
) -> dict[str, str]:
    """The dtype the first sample of a decompressed shard stores for each ``ndarray`` column
    without one in its encoding (empty when the shard has no sample)."""
    columns = _columns(data, len(names), sizes, where, first=True)
    out = {}
    for name, encoding, values in zip(names, encodings, columns):
        if encoding == "ndarray" and values:
            out[name] = _VALUE_DTYPES.get(values[0][0], "?")
    return out


def decode_shard(
    data: bytes,
    names: Sequence[str],
    encodings: Sequence[str],
    sizes: Sequence,
    where: str,
    dtypes: dict | None = None,
) -> pa.Table:
    """The rows of one decompressed shard as a table of :func:`arrow_fields`' schema.

    Raises:
        DataError: When the shard's bytes do not hold what its header says, or a sample's
            ndarray has another dtype than ``dtypes`` says, naming ``where`` and the column.
    """
    fields = arrow_fields(names, encodings, where, dtypes)
    columns = _columns(data, len(names), sizes, where)
    arrays, by_name = [], {f.name: f for f in fields}
    for name, encoding, values in zip(names, encodings, columns):
        try:
            arrays.extend(_decode_column(values, encoding, by_name, name))
        except (ValueError, TypeError, OverflowError, KeyError) as exc:
            raise DataError(
                f"Column {name!r} ({encoding}) of {where} does not decode: {exc}. Restore "
                "the file or re-write the dataset."
            ) from None
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _columns(data: bytes, width: int, sizes: Sequence, where: str, first=False) -> list[list]:
    try:
        samples = _samples(data)
        return _split_columns(samples[:1] if first else samples, width, sizes)
    except (ValueError, IndexError) as exc:
        raise DataError(
            f"{where} is not a readable MDS shard ({exc}). Restore the file or re-write the "
            "dataset."
        ) from None


def _samples(data: bytes) -> list[memoryview]:
    view = memoryview(data)
    (count,) = np.frombuffer(view[:4], np.uint32)
    offsets = np.frombuffer(view[4 : 8 + 4 * int(count)], np.uint32).astype(np.int64)
    if len(offsets) != count + 1 or offsets[-1] != len(data) or np.any(np.diff(offsets) < 0):
        raise ValueError(f"its offsets do not match its {len(data)} bytes")
    return [view[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def _split_columns(samples, width: int, sizes: Sequence) -> list[list[memoryview]]:
    variable = [i for i, s in enumerate(sizes) if not s]
    columns: list[list] = [[] for _ in range(width)]
    for sample in samples:
        head = np.frombuffer(sample[: 4 * len(variable)], np.uint32)
        if len(head) != len(variable):
            raise ValueError("a sample is shorter than its header")
        lengths = list(sizes)
        for i, n in zip(variable, head.tolist()):
            lengths[i] = n
        at = 4 * len(variable)
        for i, n in enumerate(lengths):
            columns[i].append(sample[at : at + n])
            at += n
        if at != len(sample):
            raise ValueError(f"a sample holds {len(sample)} bytes where its columns take {at}")
    return columns


def _decode_column(values, encoding: str, fields: dict, name: str) -> list[pa.Array]:
    kind = fields[name].type
    if encoding in _SCALARS:
        return [pa.array(np.frombuffer(b"".join(values), _SCALARS[encoding]), kind)]
    if encoding in _BINARY:
        return [pa.array([bytes(v) for v in values], kind)]
    if encoding in _TEXT:
        texts = [bytes(v).decode("utf-8") for v in values]
        if encoding == "json":
            for text in texts:
                json.loads(text)
        return [pa.array(texts, kind)]
    if encoding == "str_int":
        return [pa.array([int(bytes(v).decode()) for v in values], kind)]
    if encoding == "str_float":
        return [pa.array([float(bytes(v).decode()) for v in values], kind)]
    dtype, shape = ndarray_args(encoding.partition(":")[2], name, "")
    if dtype is None:  # each sample stores its dtype: all must be the column's
        dtype = kind.value_type.to_pandas_dtype().__name__
        code = {v: k for k, v in _VALUE_DTYPES.items()}[dtype]
        for row, value in enumerate(values):
            if value[0] != code:
                raise ValueError(
                    f"sample {row} is {_VALUE_DTYPES.get(value[0], value[0])} where the "
                    f"dataset's first sample is {dtype}; a table column holds one dtype: "
                    "re-write the column with 'ndarray:<dtype>'"
                )
        values = [value[1:] for value in values]
    if shape is not None:
        flat = np.frombuffer(b"".join(values), dtype)
        return [pa.FixedSizeListArray.from_arrays(pa.array(flat), int(np.prod(shape)))]
    arrays, shapes = [], []
    for value in values:
        ndim, code = value[0] >> 2, value[0] % 4
        dims = np.frombuffer(value[1 : 1 + ndim * 2**code], _SHAPE_DTYPES[code])
        flat = np.frombuffer(value[1 + ndim * 2**code :], dtype)
        if len(dims) != ndim or int(np.prod(dims)) != flat.size:
            raise ValueError(f"a sample's shape {dims.tolist()} does not match its values")
        arrays.append(flat)
        shapes.append(dims.astype(np.int64))
    offsets = np.cumsum([0, *(len(a) for a in arrays)]).astype(np.int32)
    flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype)
    return [
        pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat)),
        pa.array([s.tolist() for s in shapes], pa.list_(pa.int64())),
    ]
