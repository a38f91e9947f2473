"""Keras 3 under TF's MultiWorkerMirroredStrategy: plain ``model.fit`` fails (keras#20585), and
the same script through :mod:`keras_dl.distribute.multiworker` trains like one process.

Two real worker processes on loopback, with ``TF_CONFIG``. When the first test starts failing
because plain Keras trains, Keras has fixed it upstream: keras_dl's fix can go.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import HEAVY
from tests.distribute import mwms_fit

pytestmark = HEAVY
ROOT = Path(__file__).resolve().parents[2]


def test_plain_keras_fit_fails_under_multiworker_mirrored_strategy(tmp_path):
    reports = _run_workers("plain", tmp_path)
    assert [r["replicas"] for r in reports] == [2, 2]  # both joined one 2-replica cluster
    for report in reports:
        # TensorFlowTrainer._maybe_symbolic_build all-reduces the first PerReplica batch.
        assert "error" in report, f"plain Keras trained: keras#20585 is fixed? {report}"
        assert report["error"].startswith("ValueError: Attempt to convert a value (PerReplica")


def test_keras_dl_fit_trains_each_worker_shard_like_one_process(tmp_path):
    reports = _run_workers("keras_dl", tmp_path)
    assert all("error" not in r for r in reports), reports
    # A peer silent for the stall timeout is lost, not one silent for TF's default 10 s.
    assert [r["heartbeat"] for r in reports] == [mwms_fit.HEARTBEAT] * 2
    assert reports[0]["digest"] == reports[1]["digest"]  # bit-identical weights
    assert reports[0]["history"] == reports[1]["history"]  # logs reduced over the workers
    # One process whose every batch is both workers' batches: the same steps, had each worker
    # trained its own 8 rows (not half of them, as Keras' rebatching of its global batch would).
    import tensorflow as tf

    shards = [mwms_fit.shard(rank) for rank in (0, 1)]
    both = [
        np.concatenate([s[i].reshape(8, 8, *s[i].shape[1:]) for s in shards], axis=1).reshape(
            128, *shards[0][i].shape[1:]
        )
        for i in range(3)
    ]
    model = mwms_fit.make_model()
    batches = tf.data.Dataset.from_tensor_slices(tuple(both)).batch(16)
    model.fit(batches, epochs=2, verbose=0, shuffle=False)
    for got, want in zip(reports[0]["weights"], model.get_weights(), strict=True):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def _run_workers(mode: str, tmp_path: Path, n: int = 2) -> list[dict]:
    ports = [_free_port() for _ in range(n)]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    for index in range(n):
        env = {
            **os.environ,
            "TF_CONFIG": json.dumps(
                {"cluster": cluster, "task": {"type": "worker", "index": index}}
            ),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "CUDA_VISIBLE_DEVICES": "",
            "TF_NUM_INTRAOP_THREADS": "1",
            "TF_NUM_INTEROP_THREADS": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2",
        }
        out = tmp_path / f"{mode}-{index}.json"
        cmd = [sys.executable, "-m", "tests.distribute.mwms_fit", mode, str(out)]
        procs.append((subprocess.Popen(cmd, env=env, cwd=ROOT, stderr=subprocess.PIPE), out))
    reports = []
    for proc, out in procs:
        try:
            _, err = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for p, _ in procs:
                p.kill()
            pytest.fail(f"a {mode} worker did not finish in 240 s")
        assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
        reports.append(json.loads(out.read_text()))
    return reports


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
