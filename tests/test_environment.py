"""The pinned stack imports, Horovod included (built from source by scripts/build_horovod.sh)."""


def test_horovod_tensorflow_imports_and_allreduces():
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    assert hvd.gloo_built()
    out = hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Average)
    assert out.numpy().tolist() == [1.0, 2.0]


def test_the_current_stack_and_petastorm_through_the_layer():
    import numpy
    import pyarrow
    import pyspark
    from petastorm import reader

    from keras_dl.data.petastorm_compat import parquet_dataset

    assert int(pyarrow.__version__.split(".")[0]) >= 18
    assert numpy.__version__.startswith("2.")
    assert pyspark.__version__.startswith("4.")
    assert reader.pq is parquet_dataset  # Petastorm's own pq is the layer's legacy dataset
