"""The pinned stack imports, Horovod included (built from source by scripts/build_horovod.sh)."""


def test_horovod_tensorflow_imports_and_allreduces():
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    assert hvd.gloo_built()
    out = hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Average)
    assert out.numpy().tolist() == [1.0, 2.0]


def test_pins_that_petastorm_needs():
    import numpy
    import pyarrow
    import pyspark

    assert pyarrow.__version__ == "12.0.1"
    assert numpy.__version__.startswith("1.26")
    assert pyspark.__version__.startswith("3.5")
