"""The flowers recipe on tfds.testing.mock_data's tf_flowers: tiny images, a tiny backbone."""

import mlflow
import numpy as np
import pytest

from keras_dl.config import resolve
from keras_dl.errors import ConfigError
from keras_dl.recipe import load_recipe
from keras_dl.train import fit
from tests.conftest import run_cli, runs_in

TINY = ["data.image_size=32,32", "model.alpha=0.35", "train.batch_size=4", "train.verbose=0"]


def logged_model_uri(run) -> str:
    """The model a run logged, registered or not."""
    (logged,) = [
        m
        for m in mlflow.search_logged_models([run.info.experiment_id], output_format="list")
        if m.source_run_id == run.info.run_id
    ]
    return logged.model_uri


@pytest.fixture(scope="module")
def flowers_table(tmp_path_factory):
    """tf_flowers through the real ingest code, on TFDS's mock data (no download)."""
    import tensorflow_datasets as tfds

    from keras_dl.data.ingest.tfds import ingest_tfds

    path = str(tmp_path_factory.mktemp("flowers") / "flowers")
    with tfds.testing.mock_data(num_examples=40):
        ingest_tfds("tf_flowers", path, splits=["train"], resplit=(0.6, 0.2, 0.2), rows_per_group=8)
    return path


def _exp(table, tmp, *sets):
    recipe = load_recipe("flowers")
    return recipe, resolve(
        recipe.defaults,
        sets=[
            f"data.table={table}",
            f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}",
            f"runtime.run_dir={tmp / 'run'}",
            *TINY,
            *sets,
        ],
    )


def _backbone(model):
    return next(layer for layer in model.layers if layer.name.startswith("mobilenetv2"))


@pytest.mark.slow
def test_frozen_then_fine_tune_stage(flowers_table, tmp_path, capfd):
    recipe, exp = _exp(flowers_table, tmp_path, "train.epochs=1")  # weights=imagenet: offline
    first = fit(exp, recipe)
    err = capfd.readouterr().err
    assert "TRAINING THE BACKBONE FROM SCRATCH" in err and "model.weights=" in err
    (run,) = runs_in(exp.tracking.uri)
    assert run.data.tags["keras_dl.backbone_weights"] == "none (ImageNet download failed)"
    assert run.data.tags["keras_dl.stage"] == "frozen"
    # TFDS's mock labels are random: whether the gate registers this model is chance (it
    # refuses one no better than the majority class). The run's logged model is stage 1.
    assert "test_accuracy" in first.metrics and first.model_uri
    frozen = _backbone(first.model)
    assert not frozen.trainable and frozen.count_params() > 0
    # Stage 2 starts from stage 1's weights: a different seed proves they were loaded, not
    # re-initialised alike.
    recipe, exp2 = _exp(
        flowers_table,
        tmp_path,
        "train.epochs=1",
        "train.seed=7",
        "train.learning_rate=1e-5",
        "model.weights=none",
        f"model.fine_tune_from={first.model_uri}",
        "model.fine_tune_layers=5",
    )
    second = fit(exp2, recipe)
    tuned = _backbone(second.model)
    trainable = [layer for layer in tuned.layers if layer.trainable_weights]
    assert 0 < len(trainable) <= 5
    first_conv = tuned.layers[1]  # frozen in both stages: must hold stage 1's values
    assert not first_conv.trainable
    np.testing.assert_array_equal(first_conv.get_weights()[0], frozen.layers[1].get_weights()[0])
    runs = {r.data.tags["keras_dl.stage"]: r for r in runs_in(exp.tracking.uri)}
    assert runs["fine-tune"].data.tags["keras_dl.backbone_weights"].endswith(first.model_uri)


@pytest.mark.slow
def test_module_entry_with_mixed_precision_and_another_backbone(flowers_table, tmp_path):
    # MobileNet (v1): another backbone, and a smaller graph to trace than MobileNetV2's.
    sets = [
        *TINY,
        "train.epochs=1",
        "train.mixed_precision=true",
        "model.weights=none",
        "model.backbone=MobileNet",
    ]
    proc = run_cli(
        "-m",
        "recipes.flowers",
        "--set",
        f"data.table={flowers_table}",
        *[a for s in sets for a in ("--set", s)],
        cwd=tmp_path,
    )
    # 4: the gate refused a model no better than the majority class (random mock labels).
    assert proc.returncode in (0, 4), proc.stderr[-3000:]
    assert "model.weights=none: the MobileNet backbone trains from scratch" in proc.stderr
    (run,) = runs_in(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert run.info.status == "FINISHED" and run.data.params["train.mixed_precision"] == "True"
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    model = mlflow.pyfunc.load_model(logged_model_uri(run))
    probs = np.asarray(model.predict(np.random.default_rng(0).uniform(0, 255, (3, 32, 32, 3))))
    assert probs.shape == (3, 5) and probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-3)


def test_local_weights_file_is_loaded_into_the_backbone(tmp_path):
    import keras

    source = keras.applications.MobileNetV2(
        include_top=False, weights=None, input_shape=(32, 32, 3), alpha=0.35
    )
    path = str(tmp_path / "backbone.weights.h5")
    source.save_weights(path)
    recipe, exp = _exp("unused", tmp_path, f"model.weights={path}")
    model = recipe.build_model(None, exp)
    for got, want in zip(_backbone(model).get_weights(), source.get_weights()):
        np.testing.assert_array_equal(got, want)


def test_bad_backbone_or_weights_are_clear_errors(tmp_path):
    recipe, exp = _exp("unused", tmp_path, "model.backbone=MobileNetV9")
    with pytest.raises(ConfigError, match="not a keras.applications model.*MobileNetV2"):
        recipe.build_model(None, exp)
    recipe, exp = _exp("unused", tmp_path, "model.weights=/nope/w.weights.h5")
    with pytest.raises(ConfigError, match="neither 'imagenet', 'none' nor an existing file"):
        recipe.build_model(None, exp)
