"""A full run folder: a RunError (exit 2) naming the folder, the bytes and the fix; no partial
file left behind; and a rerun that cleans stale temporaries before it writes anything.

On a real tmpfs of a few MB (``mount -t tmpfs``), skipped with the reason where mounting is not
allowed (not root, no CAP_SYS_ADMIN).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from keras_dl.config import resolve
from keras_dl.errors import RunError
from keras_dl.recipe import load_recipe
from keras_dl.run import CONFIG_FILE, open_run
from tests.conftest import run_cli, runs_in, train_digits

_MB = 1 << 20


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MB tmpfs mounted at ``tmp_path/disk``, unmounted afterwards."""
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {(done.stderr or done.stdout).strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def _fill(disk: Path, leave: int) -> Path:
    """A file taking all of ``disk``'s free space but ``leave`` bytes."""
    filler = disk / "filler.bin"
    size = shutil.disk_usage(disk).free - leave
    assert size > 0, f"{disk} has less than {leave} bytes free"
    with open(filler, "wb") as f:
        f.write(b"\1" * size)
    return filler


def _temporaries(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if re.search(r"\.tmp(-\d+)?$", p.name)]


def _flat(text: str) -> str:
    return re.sub(r"\s+", "", text)  # the CLI wraps its message at 100 columns


def test_a_stale_temporary_is_removed_before_config_yaml_is_written(
    digits_table, small_disk, mlflow_uri
):
    run_dir = small_disk / "run"
    stale = run_dir / "checkpoints" / "ckpt-000000040.npz.4242.tmp"  # a killed writer's
    legacy = run_dir / "checkpoints" / ".ckpt-000000080.npz.tmp-4243"  # the older writer's
    stale.parent.mkdir(parents=True)
    (run_dir / ".lock").write_text("{}")  # the previous run's lock record
    legacy.write_bytes(b"\0" * 4096)
    with open(stale, "wb") as f:  # fills the disk: config.yaml cannot be written beside it
        f.write(b"\0" * shutil.disk_usage(small_disk).free)
    recipe = load_recipe("digits")
    exp = resolve(
        recipe.defaults,
        sets=[
            f"data.table={digits_table}",
            f"runtime.run_dir={run_dir}",
            f"tracking.uri={mlflow_uri}",
        ],
    )
    with open_run(exp) as run:
        run.start()
    assert (run_dir / CONFIG_FILE).read_text()
    assert not stale.exists() and not legacy.exists()


def test_a_full_disk_is_refused_without_temporaries(small_disk):
    from keras_dl.storage import open_store

    store = open_store(small_disk / "run")
    _fill(small_disk, 64 << 10)
    with pytest.raises(RunError) as err:
        store.write("big.bin", b"\2" * _MB)
    message = str(err.value)
    assert str(small_disk / "run") in message and f"{_MB} bytes" in message
    assert "runtime.run_dir" in message and "run the same command again" in message
    source = small_disk.parent / "payload.bin"
    source.write_bytes(b"\3" * _MB)
    with pytest.raises(RunError, match=f"needed {_MB} bytes"):
        store.upload(source, "payload.bin")
    assert sorted(os.listdir(small_disk / "run")) == []  # no partial file left behind


@pytest.mark.slow
def test_a_full_disk_ends_the_run_with_exit_2_and_the_rerun_resumes(
    digits_table, small_disk, tmp_path
):
    # How big a digits checkpoint is, from a one-epoch run on an ordinary disk.
    measure = tmp_path / "measure"
    measure.mkdir()
    train_digits(digits_table, measure, "train.epochs=1")
    size = max(p.stat().st_size for p in (measure / "run" / "checkpoints").glob("ckpt-*.npz"))
    run_dir = small_disk / "run"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [
        "train",
        "digits",
        "--set",
        f"data.table={digits_table}",
        "--set",
        f"runtime.run_dir={run_dir}",
        "--set",
        f"tracking.uri={uri}",
        "--set",
        "train.epochs=3",
        "--set",
        "train.verbose=0",
    ]
    # Room for the first epoch's checkpoint, not for the second's.
    filler = _fill(small_disk, size + size // 2 + (64 << 10))

    failed = run_cli(*args)

    assert failed.returncode == 2, failed.stderr[-3000:]
    assert "Traceback" not in failed.stderr
    message = _flat(failed.stderr)
    assert _flat(f"The run folder '{run_dir / 'checkpoints'}' is full") in message
    needed = int(re.search(r"needed(\d+)bytes", message).group(1))
    assert abs(needed - size) < 4096  # the second checkpoint's size
    assert _flat("set runtime.run_dir to a folder on a disk with room") in message
    assert _temporaries(run_dir) == []
    [run] = runs_in(uri)
    assert run.info.status == "FAILED"

    filler.unlink()
    resumed = run_cli(*args)

    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming from checkpoint" in resumed.stdout
    [run] = runs_in(uri)  # the same MLflow run, continued
    assert run.info.status == "FINISHED"
    import mlflow

    history = mlflow.MlflowClient(uri).get_metric_history(run.info.run_id, "loss")
    assert sorted(m.step for m in history) == [0, 1, 2]  # every epoch logged once
