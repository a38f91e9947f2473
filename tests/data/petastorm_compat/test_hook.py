"""The Petastorm import hook: the whole compatibility layer wherever Petastorm is imported.

These run fresh interpreters of the environment, so what they see comes from the .pth file
installed with keras-dl (``keras_dl_petastorm_compat.pth``) and nothing a test imported: a user
who never imports keras_dl and calls Petastorm directly.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import PETASTORM_FILES
from tests.warm_python import REAL_PYTHON

FILES, GROUPS, ROWS = PETASTORM_FILES


@pytest.fixture(scope="module")
def files(petastorm_files) -> list[str]:
    return ["file://" + f for f in petastorm_files]


def run_fresh(code: str, *args: str) -> dict:
    """Run ``code`` in a fresh interpreter of this environment; it prints one JSON object."""
    # No PYTHONPATH: the installed keras-dl (its .pth file, its hook) is what a user gets.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [REAL_PYTHON, "-c", code, *args], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_pth_file_loads_the_hook_and_not_keras_dl():
    code = (
        "import sys, json; import pyarrow; keras_dl = sorted(m for m in sys.modules if m.startswith('keras_dl.') or m == 'keras_dl'); "
        "legacy = type(pyarrow.localfs).__module__; "
        "print(json.dumps({'hook': 'keras_dl_petastorm_hook' in sys.modules, 'keras_dl': keras_dl, 'legacy': legacy}))"
    )  # fmt: skip
    seen = run_fresh(code)
    # pyarrow alone loads no keras_dl; its removed legacy names load the layer when asked for.
    assert seen == {
        "hook": True,
        "keras_dl": [],
        "legacy": "keras_dl.data.petastorm_compat.filesystem",
    }


def test_a_fresh_interpreter_imports_petastorm_through_the_layer():
    from keras_dl.data.petastorm_compat import parquet_dataset

    code = (
        "import json, petastorm.reader as r, petastorm.arrow_reader_worker as w, petastorm.unischema as u; "
        "from petastorm.workers_pool.thread_pool import ThreadPool; from petastorm.etl import dataset_metadata as d; "
        "print(json.dumps({'pq': [r.pq.__name__, w.pq.__name__], 'race': getattr(ThreadPool.all_workers_done, '_keras_dl_patched', False), "
        "'types': getattr(u._numpy_and_codec_from_arrow_type, '_keras_dl_patched', False), 'unpickle': d.get_schema.__module__}))"
    )  # fmt: skip
    expected = parquet_dataset.__name__ if parquet_dataset.needed() else "pyarrow.parquet"
    assert run_fresh(code) == {
        "pq": [expected, expected],
        "race": True,
        "types": True,
        "unpickle": "keras_dl.data.petastorm_compat.unpickle",
    }


def test_petastorms_own_reader_reads_every_row_group_and_repeats_a_seed(files):
    # Without the race fix 5-6 of 30 one-epoch thread-pool reads lost row groups here, and one
    # seed gave different orders; the user calls Petastorm directly, never keras_dl.
    code = """
import json, sys
from petastorm import make_batch_reader

def read(**kwargs):
    with make_batch_reader(sys.argv[1:], num_epochs=1, reader_pool_type="thread", workers_count=3, **kwargs) as r:
        return [int(i) for b in r for i in b.id]

full = [sorted(read(shuffle_row_groups=False)) for _ in range(15)]
seeded = [read(shuffle_row_groups=True, seed=7) for _ in range(4)]
print(json.dumps({"full": full, "seeded": seeded, "keras_dl": "keras_dl" in sys.modules}))
"""
    seen = run_fresh(code, *files)
    written = list(range(FILES * GROUPS * ROWS))
    assert all(ids == written for ids in seen["full"])
    assert sorted(seen["seeded"][0]) == written and seen["seeded"][0] != written
    assert all(order == seen["seeded"][0] for order in seen["seeded"])


def test_weighted_sampling_reader_runs(files):
    # petastorm/weighted_sampling_reader.py:62 uses np.float, which numpy 1.24 removed.
    code = """
import json, sys
from petastorm import make_batch_reader
from petastorm.weighted_sampling_reader import WeightedSamplingReader

first, second = (make_batch_reader(sys.argv[i], num_epochs=1, workers_count=1, shuffle_row_groups=False) for i in (1, 2))
with WeightedSamplingReader([first, second], [1, 0]) as mixed:
    print(json.dumps([int(i) for batch in mixed for i in batch.id]))
"""
    assert run_fresh(code, *files[:2]) == list(range(GROUPS * ROWS))


def test_every_numpy_name_petastorm_uses_is_there():
    import importlib.util

    from keras_dl.data import petastorm_compat

    petastorm_compat.prepare()
    package = Path(importlib.util.find_spec("petastorm").submodule_search_locations[0])
    used = {
        name
        for path in package.rglob("*.py")
        for name in re.findall(r"\bnp\.([A-Za-z_]\w*)", path.read_text())
    }
    missing = [
        n for n in sorted(used)
        if n not in np.__dict__ and importlib.util.find_spec(f"numpy.{n}") is None
    ]  # fmt: skip
    assert "float" in used and "unicode_" in used  # the scan sees Petastorm's source
    assert not missing, f"numpy names Petastorm uses that this numpy lacks: {missing}"
