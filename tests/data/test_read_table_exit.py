"""A script that calls read_table exits cleanly: deltalake 0.18.2 aborted at interpreter exit
("terminate called without an active exception") in about 4 of 10 scripts that read through
its to_pyarrow_table() (the old pin); keras_dl reads the Delta log itself, and this keeps it so."""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from tests.conftest import REPO, write_test_table
from tests.warm_python import REAL_PYTHON

SCRIPT = """
import sys
from keras_dl.data import read_table
table = read_table(sys.argv[1], version=1, columns=["x"])
print(table.num_rows, int(sum(table.column("x").to_pylist())))
"""


@pytest.mark.slow
def test_twenty_scripts_calling_read_table_all_exit_zero(tmp_path):
    path = str(tmp_path / "t")
    write_test_table(path, pa.table({"x": np.arange(100, dtype=np.int64)}), rows_per_group=25)
    write_deltalake(path, pa.table({"x": np.arange(100, 150, dtype=np.int64)}), mode="append")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}

    def run(_):
        return subprocess.run(
            [REAL_PYTHON, "-c", SCRIPT, path],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, range(20)))
    for proc in results:
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "terminate called" not in proc.stderr
        assert proc.stdout.split() == ["150", str(sum(range(150)))]
