"""Every writer of tables the data path reads: sources into Delta tables.

- :mod:`~keras_dl.data.ingest.datasets`: numpy/pandas/Arrow rows to a Delta table
  (:func:`write_table`), and scikit-learn's digits;
- :mod:`~keras_dl.data.ingest.tfds`, :mod:`~keras_dl.data.ingest.images` and
  :mod:`~keras_dl.data.ingest.mds`: a TFDS dataset, a folder-per-class image tree, a Mosaic
  StreamingDataset (MDS) folder (``keras-dl ingest tfds|images|mds``);
- :mod:`~keras_dl.data.ingest.spark_delta`: a Spark DataFrame, written by the executors and
  committed once by the driver (no Delta jars);
- :mod:`~keras_dl.data.ingest.parquet_files`: the Parquet files (page checksums) and the Delta
  ``add`` actions the writers above commit.

(The test suite's writer of Delta tables with deletion vectors and column mapping, from the
protocol's text, is ``tests/fixtures/delta_protocol.py``: not part of the product.)

Writers sit beside the read path (:mod:`keras_dl.data.stream`) and use only
:mod:`keras_dl.data.tables` below them.
"""

from keras_dl.data.ingest.datasets import assign_splits, ingest_sklearn_digits, write_table
from keras_dl.data.ingest.spark_delta import write_delta

__all__ = ["assign_splits", "ingest_sklearn_digits", "write_delta", "write_table"]
