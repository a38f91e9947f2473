"""The suite's JVM options (tests/jvm_options.py): Spark's classes come from the run's archive."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests import jvm_options


def _run_archive(timeout: float = 600) -> Path:
    """The archive the run's first process builds in the background, once it is in place."""
    if not jvm_options._ours(os.environ.get("JDK_JAVA_OPTIONS"), jvm_options.ARCHIVE):
        pytest.skip("JDK_JAVA_OPTIONS was set by the caller: the run builds no class archive")
    deadline = time.monotonic() + timeout
    while not jvm_options.ARCHIVE.exists():
        assert time.monotonic() < deadline, f"no class archive at {jvm_options.ARCHIVE}"
        time.sleep(2)
    return jvm_options.ARCHIVE


def test_a_spark_jvm_loads_spark_classes_from_the_archive(tmp_path):
    import pyspark

    archive = _run_archive()
    log = tmp_path / "classes.log"
    # Spark's launcher, then the JVM it builds the command of (the class path a session's has);
    # each opens the log anew (the launcher's is rotated away), so it ends as the second's.
    env = dict(os.environ)
    env["JDK_JAVA_OPTIONS"] = f"{jvm_options.options(archive)} -Xlog:class+load=info:file={log}"
    env.pop("SPARK_HOME", None)
    out = subprocess.run(
        [str(Path(pyspark.__file__).parent / "bin" / "spark-submit"), "--version"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = log.read_text().splitlines()
    loaded = [line for line in lines if " org.apache.spark.deploy.SparkSubmit" in line]
    # Lambdas are spun at run time, not archived.
    spark = [line for line in lines if " org.apache.spark." in line and "$$Lambda" not in line]
    shared = [line for line in spark if "source: shared objects file (top)" in line]
    assert loaded, "the log is not the Spark JVM's"
    assert len(shared) >= 0.9 * len(spark), [line for line in spark if line not in shared][:20]


def test_the_options_follow_the_archive_and_leave_the_callers_own(tmp_path, monkeypatch):
    archive = tmp_path / "classes.jsa"
    base = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    assert jvm_options.options(archive) == base
    monkeypatch.setenv("JDK_JAVA_OPTIONS", base)
    jvm_options.refresh(archive)
    assert os.environ["JDK_JAVA_OPTIONS"] == base  # no archive yet: nothing to map
    archive.write_bytes(b"")
    jvm_options.refresh(archive)
    assert os.environ["JDK_JAVA_OPTIONS"] == (
        f"{base} -XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"
    )
    monkeypatch.setenv("JDK_JAVA_OPTIONS", "-Xmx2g")
    jvm_options.refresh(archive)
    assert os.environ["JDK_JAVA_OPTIONS"] == "-Xmx2g"
    assert jvm_options.prepare(tmp_path / "other.jsa") is None  # the caller's: nothing built
    monkeypatch.setenv("JDK_JAVA_OPTIONS", base)
    # Nowhere to write the archive (or its build's log): nothing started, the run goes on.
    assert jvm_options.prepare(tmp_path / "missing" / "classes.jsa") is None


def test_a_build_that_fails_says_why_at_the_end_of_the_run(tmp_path, monkeypatch):
    archive = tmp_path / "classes.jsa"
    monkeypatch.delenv("JDK_JAVA_OPTIONS", raising=False)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))  # Spark's launcher finds no java
    build = jvm_options.prepare(archive)
    assert build is not None
    build.wait(timeout=300)

    problem = jvm_options.build_problem(build, archive)

    assert build.returncode != 0 and not archive.exists()
    assert problem is not None and str(archive) in problem
    assert "the class archive's session failed" in problem  # the build's own words, from its log
    assert jvm_options.build_problem(None, archive) is None
