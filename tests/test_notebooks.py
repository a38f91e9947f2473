"""The notebooks run top to bottom with small settings, and say what they should."""

import re
from pathlib import Path

import mlflow
import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import REPO, STARTS_FIRST, seed_store

NOTEBOOKS = REPO / "notebooks"


def _execute(name: str, tmp_path: Path, monkeypatch, **env: str) -> nbformat.NotebookNode:
    (tmp_path / "work").mkdir()
    seed_store(tmp_path / "work" / "mlflow.db")  # the notebooks' TRACKING_URI
    monkeypatch.setenv("KERAS_DL_NB_WORKDIR", str(tmp_path / "work"))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on failure
    return nb


def _text(nb: nbformat.NotebookNode) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts.append(out.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def _images(nb: nbformat.NotebookNode) -> int:
    return sum(
        "image/png" in out.get("data", {}) for cell in nb.cells for out in cell.get("outputs", [])
    )


def test_notebooks_are_generated_from_their_script():
    """The .ipynb files are what notebooks/make_notebooks.py writes (no hand edits to lose)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_nb", NOTEBOOKS / "make_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, build in (
        ("01_explore_data", module.explore),
        ("02_build_modules", module.build_modules),
        ("03_train_and_scale", module.train_and_scale),
        ("04_spark_ml_pipeline", module.spark_ml_pipeline),
        ("05_nightly_loop", module.nightly_loop),
    ):
        stored = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        assert [c.source for c in stored.cells] == [c.source for c in build().cells], name


@pytest.mark.slow
def test_01_explore_data(tmp_path, monkeypatch):
    nb = _execute("01_explore_data", tmp_path, monkeypatch, KERAS_DL_NB_WORKERS="2")
    text = _text(nb)
    # delta-rs 1.x names a list's values "element" (Parquet's name), pyarrow "item"
    assert "1797 rows" in text and re.search(r"pixels: list<(item|element): float>", text)
    assert "ok: every partition has >= 2 rows for 2 workers" in text
    assert "--rows-per-group" in text  # the advice for 16 workers
    assert _images(nb) == 1


@pytest.mark.slow
def test_02_build_modules(tmp_path, monkeypatch):
    nb = _execute("02_build_modules", tmp_path, monkeypatch, KERAS_DL_NB_EPOCHS="2")
    text = _text(nb)
    assert "Total params" in text and "steps/epoch 40" in text
    assert "samples_per_sec" in text or "steps_per_sec" in text
    assert "test: {" in text


@STARTS_FIRST
@pytest.mark.slow
def test_03_train_and_scale(tmp_path, monkeypatch):
    # Scoring 1,797 rows on local[1]: one Spark Python worker imports TensorFlow, not two.
    nb = _execute(
        "03_train_and_scale", tmp_path, monkeypatch, KERAS_DL_NB_EPOCHS="2",
        KERAS_DL_NB_SPARK_MASTER="local[1]",
    )  # fmt: skip
    text = _text(nb)
    for setup in ("one device", "MirroredStrategy (2)", "Horovod np=-2"):
        assert setup in text, setup
    assert _images(nb) == 1
    uri = f"sqlite:///{tmp_path / 'work' / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    versions = client.search_model_versions("name='digits'")
    assert len(versions) == 3  # one registered version per setup
    champion = client.get_model_version_by_alias("digits", "champion")
    runs = client.search_runs(
        [client.get_experiment_by_name("digits").experiment_id], order_by=["metrics.val_loss ASC"]
    )
    assert champion.run_id == runs[0].info.run_id
    assert all(r.info.status == "FINISHED" for r in runs) and len(runs) == 3
    assert "validation" in text and "accuracy" in text and "1257" in text  # the scored splits


@STARTS_FIRST
@pytest.mark.slow
def test_04_spark_ml_pipeline(tmp_path, monkeypatch):
    # 3: 12 epochs for each of the 4 fits (the pipeline, 2 trials, the refit)
    nb = _execute("04_spark_ml_pipeline", tmp_path, monkeypatch, KERAS_DL_NB_EPOCHS="3")
    text = _text(nb)
    accuracy = float(text.split("test accuracy: ")[1].split()[0])
    assert accuracy >= 0.8, text
    assert "same predictions after load: True" in text
    assert "3 child runs under" in text  # two trials, then the refit of the best


@pytest.mark.slow
def test_05_nightly_loop(tmp_path, monkeypatch):
    nb = _execute("05_nightly_loop", tmp_path, monkeypatch, KERAS_DL_NB_EPOCHS="15")
    text = _text(nb)
    assert "champion -> version 1" in text and "table at version 1, last trained on 0" in text
    assert "model.init_from: models:/nightly@champion" in text
    assert "keras_dl.init_from: models:/nightly/1" in text
    assert "data.version_range: (0,1]" in text and "data.train_rows: 160" in text
    assert "beats nightly@champion (version 1)" in text
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'work' / 'mlflow.db'}")
    assert int(client.get_model_version_by_alias("nightly", "champion").version) == 2
