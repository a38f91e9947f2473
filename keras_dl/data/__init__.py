"""The data path: table -> snapshot -> Petastorm reader -> tf.data (and ``read_table``)."""

from keras_dl.data.features import ColumnPlan, FeatureSpec, plan_columns
from keras_dl.data.filters import select
from keras_dl.data.images import ImagePreprocess, make_image_preprocess
from keras_dl.data.read import read_table
from keras_dl.data.snapshot import TableSnapshot
from keras_dl.data.spark import SparkConverter, make_spark_converter
from keras_dl.data.splits import DataSplits, make_splits
from keras_dl.data.tables import open_table
from keras_dl.data.tfdata import ReadOptions, SplitData, make_dataset, original_errors

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
