"""Save and load a :class:`~keras_dl.spark.KerasModel` the Spark ML way.

``PATH/metadata`` holds the class and the Params as Spark ML's ``DefaultParamsWriter`` writes
them, so ``PipelineModel.load`` finds the class and calls ``KerasModel.load``; ``PATH/model.keras``
holds the keras.Model (architecture, weights). PATH may be a local folder or a URI that
pyarrow's filesystems reach (the Keras file goes through a local temp file).
"""

from __future__ import annotations

import os
import shutil
import tempfile

from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReader, MLWriter

MODEL_FILE = "model.keras"


class KerasModelWriter(MLWriter):
    """Writes a KerasModel's Params and its keras.Model."""

    def __init__(self, instance):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        """Write ``path/metadata`` and ``path/model.keras``."""
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession)
        with tempfile.TemporaryDirectory(prefix="keras_dl_save_") as tmp:
            local = os.path.join(tmp, MODEL_FILE)
            self.instance.getModel().save(local)
            _copy(local, _join(path, MODEL_FILE))


class KerasModelReader(MLReader):
    """Reads what :class:`KerasModelWriter` wrote."""

    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path: str):
        """The KerasModel saved at ``path``, with its uid, Params and keras.Model."""
        import keras

        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        with tempfile.TemporaryDirectory(prefix="keras_dl_load_") as tmp:
            local = os.path.join(tmp, MODEL_FILE)
            _copy(_join(path, MODEL_FILE), local)
            model = keras.saving.load_model(local, compile=False)
        return instance._with_model(model)


def _join(path: str, name: str) -> str:
    return f"{path.rstrip('/')}/{name}"


def _copy(src: str, dst: str) -> None:
    """Copy one file between local paths and URIs (file:, s3:, gs:, hdfs: ...)."""
    if not _remote(src) and not _remote(dst):
        os.makedirs(os.path.dirname(_local(dst)), exist_ok=True)
        shutil.copyfile(_local(src), _local(dst))
        return
    import pyarrow.fs as pafs

    src_fs, src_path = _filesystem(src)
    dst_fs, dst_path = _filesystem(dst)
    pafs.copy_files(src_path, dst_path, source_filesystem=src_fs, destination_filesystem=dst_fs)


def _filesystem(path: str):
    """``(filesystem, path)``: Azure's through keras_dl's settings (pyarrow's own URI parsing
    ignores the AZURE_STORAGE_* variables), other URIs as pyarrow opens them."""
    import pyarrow.fs as pafs

    if not _remote(path):
        return _local_fs(path)
    from keras_dl.storage import filesystem, is_azure

    return filesystem(path) if is_azure(path) else pafs.FileSystem.from_uri(path)


def _remote(path: str) -> bool:
    return "://" in path and not path.startswith("file:")


def _local(path: str) -> str:
    return path.removeprefix("file://").removeprefix("file:")


def _local_fs(path: str):
    import pyarrow.fs as pafs

    return pafs.LocalFileSystem(), os.path.abspath(_local(path))
