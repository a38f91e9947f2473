"""The data path: table -> snapshot -> Petastorm reader -> tf.data (and ``read_table``)."""

from keras_dl.data.spark_converter import SparkConverter, make_spark_converter
from keras_dl.data.splits import DataSplits, make_splits
from keras_dl.data.stream.features import ColumnPlan, FeatureSpec, plan_columns
from keras_dl.data.stream.tfdata import ReadOptions, SplitData, make_dataset, original_errors
from keras_dl.data.tables import open_table
from keras_dl.data.tables.filters import select
from keras_dl.data.tables.images import ImagePreprocess, make_image_preprocess
from keras_dl.data.tables.snapshot import TableSnapshot
from keras_dl.data.training_rows import read_table

__all__ = [
    "ColumnPlan",
    "DataSplits",
    "FeatureSpec",
    "ImagePreprocess",
    "ReadOptions",
    "SparkConverter",
    "SplitData",
    "TableSnapshot",
    "make_dataset",
    "make_image_preprocess",
    "make_splits",
    "make_spark_converter",
    "open_table",
    "original_errors",
    "plan_columns",
    "read_table",
    "select",
]
