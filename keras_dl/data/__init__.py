"""The data path: source -> snapshot -> Petastorm reader -> tf.data."""

from keras_dl.data.features import ColumnPlan, FeatureSpec, plan_columns
from keras_dl.data.sources import TableSnapshot, open_table, select
from keras_dl.data.splits import DataSplits, make_splits
from keras_dl.data.tfdata import ReadOptions, SplitData, make_dataset

__all__ = [
    "ColumnPlan",
    "DataSplits",
    "FeatureSpec",
    "ReadOptions",
    "SplitData",
    "TableSnapshot",
    "make_dataset",
    "make_splits",
    "open_table",
    "plan_columns",
    "select",
]
