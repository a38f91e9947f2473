"""The options every JVM of the suite starts with (``JDK_JAVA_OPTIONS``), and the class archive
they share.

The suite starts about 90 JVMs (each worker's local Spark session, the CLI's Spark drivers, the
loopback cluster's daemons and executors, Connect servers), and loading and verifying Spark's
classes is most of what a short-lived one costs. Every JVM of a run gets:

- ``-XX:TieredStopAtLevel=1``: C1 only. The data are tiny and the JVMs short-lived; C2's
  optimizations never pay for themselves (35 % less CPU to start a session and run a few jobs).
- ``-XX:+UseSerialGC``: no G1 threads and regions; a local session doing small jobs made fewer
  page faults (140 k instead of 205 k over 30 jobs; 115-119 k instead of 127-145 k over 5) with a
  lower peak RSS (465-530 MB instead of 474-740).
- ``-XX:SharedArchiveFile=ARCHIVE`` when :data:`ARCHIVE` exists: a dynamic CDS archive of the
  classes a local session loads (Java 17's AppCDS), built once per venv in the background of a
  run's first minute (:func:`prepare`, from the xdist controller or a plain ``pytest``; each test
  process turns it on by :func:`refresh` once it is in place). The JVMs map the parsed, verified classes from it instead of reading them from Spark's jars:
  the same session and jobs took its JVM 6.9-7.8 CPU-s instead of 12.5-14.1. A JVM whose class
  path differs from the archive's (Spark's launcher) or whose jars changed since, ignores it and
  loads its classes as usual; ``-Xlog:cds=off`` keeps that silent, since Spark's launcher prints
  the command it builds on stdout.

Users' JVMs keep Java's defaults: this is the tests' environment only. ``JDK_JAVA_OPTIONS`` set
by the caller is kept as it is.

``python -m tests.jvm_options --build [PATH]`` builds it (anew) and prints the options.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# In the venv (sys.prefix): a new venv, with other jars, builds its own.
ARCHIVE = Path(sys.prefix) / "keras-dl-spark-classes.jsa"
BASE = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")
BUILD_TIMEOUT = 600  # seconds; a quiet 2-core machine builds it in about 40
REPO = Path(__file__).resolve().parent.parent


def options(archive: Path = ARCHIVE) -> str:
    """``JDK_JAVA_OPTIONS`` for the suite's JVMs: the archive's when it exists."""
    shared = (f"-XX:SharedArchiveFile={archive}", *QUIET) if archive.exists() else ()
    return " ".join((*BASE, *shared))


def prepare(archive: Path = ARCHIVE) -> subprocess.Popen | None:
    """Called once per run, before any test: start building the archive in the background when
    it is missing (:func:`build`, in a process of its own that outlives the run if it must), and
    return that process. The tests do not wait for it: :func:`refresh` points a test process's
    ``JDK_JAVA_OPTIONS`` at the archive once it is in place, and the JVMs started before that
    run as they would without it."""
    if archive.exists() or not _ours(os.environ.get("JDK_JAVA_OPTIONS"), archive):
        return None
    env = dict(os.environ, JDK_JAVA_OPTIONS=" ".join(BASE))
    try:
        log = open(build_log(archive), "w")  # noqa: SIM115 (closed below; the child keeps its own)
    except OSError:  # no folder to write in: no archive either, and the run goes on without
        return None
    with log:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.jvm_options", "--build", str(archive)],
            env=env,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # not in the run's process group: a ^C leaves it to finish
        )


def build_log(archive: Path = ARCHIVE) -> Path:
    """Where the build :func:`prepare` starts writes what it says (beside the archive)."""
    return archive.with_name(f"{archive.name}.log")


def build_problem(process: subprocess.Popen | None, archive: Path = ARCHIVE) -> str | None:
    """What a run should say of the build :func:`prepare` started: nothing while it runs or once
    it built the archive; else that it failed, with the end of its log. A failed build costs
    the run only speed (its JVMs load Spark's classes from the jars), so nothing else shows it."""
    if process is None or process.poll() in (None, 0):
        return None
    log = build_log(archive)
    said = log.read_text(errors="replace").strip() if log.exists() else "(no log)"
    if len(said) > 2000:  # its first words say what failed, its last the error it ended on
        said = f"{said[:500]}\n[...]\n{said[-1500:]}"
    return (
        f"the JVMs' class archive {archive} was not built (exit {process.returncode}): the "
        f"run's JVMs loaded Spark's classes from its jars; the next run tries again. "
        f"{log} says:\n{said}"
    )


def refresh(archive: Path = ARCHIVE) -> None:
    """Point ``JDK_JAVA_OPTIONS`` at the archive once it exists, when the options are ours
    (each test process calls it before every test: a ``stat``)."""
    current = os.environ.get("JDK_JAVA_OPTIONS")
    if _ours(current, archive) and current != options(archive):
        os.environ["JDK_JAVA_OPTIONS"] = options(archive)


def _ours(current: str | None, archive: Path) -> bool:
    """Whether ``JDK_JAVA_OPTIONS`` is unset or what this module set (not the caller's own)."""
    return current in (None, " ".join(BASE), options(archive))


def build(archive: Path = ARCHIVE) -> str | None:
    """Run :func:`_load_classes` under a JVM that archives its classes at exit, then move the
    archive into place, whole or not at all. Returns why it failed, or None."""
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    env["JDK_JAVA_OPTIONS"] = " ".join((*BASE, f"-XX:ArchiveClassesAtExit={partial}", *QUIET))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.jvm_options", "--load-classes"],
            env=env,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            cwd=REPO,
        )
        if done.returncode != 0 or not partial.exists():
            return f"the class archive's session failed ({done.returncode}): {done.stderr[-2000:]}"
        os.replace(partial, archive)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the class archive was not built: {exc}"
    finally:
        partial.unlink(missing_ok=True)
    return None


def _load_classes() -> None:
    """A local session that does what the suite's sessions do, in small: Arrow both ways, a
    Parquet write and read, an aggregation, pandas UDFs, a barrier stage and an ML pipeline."""
    import pandas as pd
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    with tempfile.TemporaryDirectory() as tmp:
        frame = pd.DataFrame({"a": range(200), "b": [i % 7 for i in range(200)]})
        df = spark.createDataFrame(frame.assign(c=frame.a * 0.5))
        df.write.mode("overwrite").partitionBy("b").parquet(f"{tmp}/t")
        back = spark.read.parquet(f"{tmp}/t")
        back.groupBy("b").agg(F.count("a"), F.avg("c")).toPandas()
        back.mapInPandas(lambda parts: parts, back.schema).count()
        spark.sparkContext.parallelize(range(2), 2).barrier().mapPartitions(
            lambda rows: rows
        ).collect()
        features = VectorAssembler(inputCols=["a", "c"], outputCol="features")
        Pipeline(stages=[features]).fit(back).transform(back).select("features").collect()
        back.orderBy(F.col("a").desc()).limit(3).collect()
    jvm = spark.sparkContext._gateway.proc  # spark-submit, which became the JVM (exec)
    spark.stop()
    # The JVM writes the archive as it exits, which it does when its stdin closes: wait for it.
    jvm.stdin.close()
    jvm.wait(timeout=BUILD_TIMEOUT)


if __name__ == "__main__":
    if "--load-classes" in sys.argv:
        _load_classes()
    elif "--build" in sys.argv:
        path = Path(sys.argv[-1]) if sys.argv[-1] != "--build" else ARCHIVE
        started = time.monotonic()
        problem = build(path)
        if problem:
            sys.exit(problem)
        print(f"built {path} in {time.monotonic() - started:.0f} s: {options(path)}")
