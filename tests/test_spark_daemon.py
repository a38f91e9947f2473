"""keras_dl's Spark sessions fork their Python workers from a daemon that imported TensorFlow,
Keras and MLflow once (keras_dl.spark_daemon), and that daemon keeps Spark's channel
clean. Scoring, tuning and the estimator on these workers are the other Spark tests."""

import os
import subprocess
import textwrap

from keras_dl.distribute.loopback import DAEMON
from tests.warm_python import REAL_PYTHON


def _probe(_):
    """On a Spark worker: the module its daemon runs as ``__main__`` (a forked worker keeps its
    daemon's), and whether the parent (the daemon) has TensorFlow's library mapped (the
    worker's own modules prove nothing: a reused worker may have imported TensorFlow itself).
    The module, not the daemon's command line: under the suite's warm interpreter
    (tests/warm_python.py) the daemon is a child forked from the xdist worker's server, which
    runs it as ``python -m`` would, under the server's command line."""
    import os
    import sys

    main = getattr(sys.modules["__main__"], "__spec__", None)
    with open(f"/proc/{os.getppid()}/maps") as f:
        maps = f.read()
    yield main and main.name, "libtensorflow_framework" in maps


def test_workers_fork_from_the_daemon_that_imported_tensorflow(spark):
    rows = spark.sparkContext.parallelize([0, 1], 2).mapPartitions(_probe).collect()
    assert len(rows) == 2
    for module, tensorflow_loaded in rows:
        assert module == DAEMON, module
        assert tensorflow_loaded, f"the daemon {module} did not import TensorFlow"


PRELOAD = textwrap.dedent(
    """
    import sys
    from keras_dl import spark_daemon

    def noisy():
        print("printed by an import")
        sys.stdout.flush()

    def broken():
        raise ImportError("no such package")

    failed = spark_daemon.preload((("noisy", noisy), ("broken", broken)))
    sys.stdout.write("AFTER " + ",".join(failed))
    """
)


def test_preload_keeps_the_daemons_stdout_for_spark_and_leaves_failures_to_the_workers():
    out = subprocess.run(
        [REAL_PYTHON, "-c", PRELOAD],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONUNBUFFERED": "YES"},
    )
    # Spark reads the daemon's port from its stdout: nothing an import prints may precede it.
    assert out.stdout == "AFTER broken"
    assert "printed by an import" in out.stderr


def test_a_gpu_host_leaves_tensorflow_to_each_worker():
    from keras_dl.spark_daemon import preloads

    names = [name for name, _ in preloads(gpu_host=False)]
    assert names == ["pyarrow, pandas", "tensorflow", "keras", "mlflow"]
    # CUDA cannot serve a process forked after it was initialized.
    assert [name for name, _ in preloads(gpu_host=True)] == ["pyarrow, pandas", "mlflow"]


GPU_HOST_PRELOAD = textwrap.dedent(
    """
    import sys
    from keras_dl import spark_daemon

    failed = spark_daemon.preload(spark_daemon.preloads(gpu_host=True))
    loaded = [name for name in ("tensorflow", "keras", "mlflow.pyfunc") if name in sys.modules]
    sys.stdout.write("FAILED " + ",".join(failed) + " LOADED " + ",".join(loaded))
    """
)


def test_a_gpu_hosts_daemon_loads_mlflow_through_tracking_without_tensorflow():
    """MLflow's one home (keras_dl.tracking) must not pull TensorFlow or Keras in behind the
    daemon's back: on a GPU host a forked worker could not then use CUDA."""
    out = subprocess.run(
        [REAL_PYTHON, "-c", GPU_HOST_PRELOAD], capture_output=True, text=True, check=True
    )
    assert out.stdout == "FAILED  LOADED mlflow.pyfunc", (out.stdout, out.stderr[-2000:])
