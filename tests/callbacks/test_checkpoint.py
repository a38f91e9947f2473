"""Checkpoint on a tiny model: retention, atomic files, exact restore, mid-epoch resume."""

from __future__ import annotations

import logging
from pathlib import Path

import keras
import numpy as np

from keras_dl.callbacks import Checkpoint
from keras_dl.callbacks.checkpoint import COMPLETE, list_checkpoints, read_header
from tests.callbacks.helpers import tiny_data, tiny_model

STEPS = 4  # 128 rows / batch 32


def _fit(model, ckpt, epochs):
    x, y = tiny_data()
    return model.fit(x, y, epochs=epochs, batch_size=32, verbose=0, callbacks=[ckpt])


def _state(model):
    return [v.numpy() for v in model.variables] + [v.numpy() for v in model.optimizer.variables]


def test_keeps_the_last_k_complete_files_and_restores_the_exact_state(tmp_path):
    model = tiny_model()
    _fit(model, Checkpoint(tmp_path, keep=2), epochs=4)
    files = list_checkpoints(tmp_path)
    assert [Path(p).name for p in files] == ["ckpt-000000012.npz", "ckpt-000000016.npz"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        COMPLETE,
        "ckpt-000000012.json",  # the manifests: each counts its checkpoint
        "ckpt-000000012.npz",
        "ckpt-000000016.json",
        "ckpt-000000016.npz",
    ]
    header = read_header(files[-1])
    assert (header["epoch"], header["step"], header["steps_per_epoch"]) == (4, 0, STEPS)

    (tmp_path / COMPLETE).unlink()  # as if the process had died after its last checkpoint
    other = tiny_model(seed=1)
    ckpt = Checkpoint(tmp_path)
    ckpt.set_model(other)
    assert ckpt.restore() == 16
    for got, want in zip(_state(other), _state(model)):  # weights, dropout seed, Adam slots
        np.testing.assert_array_equal(got, want)
    # fit continues at epoch 4: the epochs already done are not repeated.
    history = _fit(other, ckpt, epochs=6)
    assert history.epoch == [4, 5] and int(other.optimizer.iterations) == 6 * STEPS


def test_mid_epoch_checkpoint_resumes_with_only_the_missing_steps(tmp_path):
    model = tiny_model()
    _fit(model, Checkpoint(tmp_path, every_n_steps=3, keep=10), epochs=2)
    steps = [read_header(p)["global_step"] for p in list_checkpoints(tmp_path)]
    assert steps == [3, 4, 6, 8]  # every 3 steps, plus each epoch's end
    for p in list_checkpoints(tmp_path)[1:]:  # as if killed right after global step 3:
        Path(p).unlink()  # epoch 0, step 3 of 4
        Path(p).with_suffix(".json").unlink()
    (tmp_path / COMPLETE).unlink()
    other = tiny_model(seed=1)
    seen = []
    history = other.fit(
        *tiny_data(),
        epochs=3,
        batch_size=32,
        verbose=0,
        callbacks=[
            Checkpoint(tmp_path, keep=10),
            _StepCounter(seen),
        ],
    )
    # Epoch 0 finishes with its one missing step, then epochs 1 and 2 run in full.
    assert history.epoch == [0, 1, 2] and seen == [1, STEPS, STEPS]
    assert int(other.optimizer.iterations) == 3 * STEPS
    assert read_header(list_checkpoints(tmp_path)[-1])["global_step"] == 3 * STEPS


def test_a_partial_newest_file_falls_back_to_the_last_good_one(tmp_path, caplog):
    model = tiny_model()
    _fit(model, Checkpoint(tmp_path, keep=3), epochs=2)
    (tmp_path / COMPLETE).unlink()
    good = Path(list_checkpoints(tmp_path)[-1])
    data = good.read_bytes()
    # What a kill during a plain (non-atomic) write leaves: a newer name, half the bytes.
    (tmp_path / "ckpt-000000099.npz").write_bytes(data[: len(data) // 2])
    # What a kill during our own write leaves: a temporary file.
    (tmp_path / ".ckpt-000000100.npz.tmp-4242").write_bytes(data[:64])
    other = tiny_model(seed=1)
    ckpt = Checkpoint(tmp_path)
    ckpt.set_model(other)
    with caplog.at_level(logging.WARNING):
        assert ckpt.restore() == 2 * STEPS
    assert "Skipping unreadable checkpoint" in caplog.text and "ckpt-000000099.npz" in caplog.text
    assert not (tmp_path / ".ckpt-000000100.npz.tmp-4242").exists()
    for got, want in zip(_state(other), _state(model)):
        np.testing.assert_array_equal(got, want)


def test_finished_training_or_resume_false_starts_fresh(tmp_path):
    _fit(tiny_model(), Checkpoint(tmp_path), epochs=2)
    assert (tmp_path / COMPLETE).exists()
    history = _fit(tiny_model(seed=1), Checkpoint(tmp_path), epochs=2)
    assert history.epoch == [0, 1]  # the finished training is not "resumed"

    (tmp_path / COMPLETE).unlink()
    history = _fit(tiny_model(seed=2), Checkpoint(tmp_path, resume=False), epochs=1)
    assert history.epoch == [0]
    assert [read_header(p)["global_step"] for p in list_checkpoints(tmp_path)] == [STEPS]


def test_diverged_epochs_are_not_checkpointed(tmp_path):
    x, _ = tiny_data()
    y = x.sum(1)
    y[5] = np.nan
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("adam", "mse")
    model.fit(x, y, epochs=2, batch_size=32, verbose=0, callbacks=[Checkpoint(tmp_path)])
    assert list_checkpoints(tmp_path) == []


class _StepCounter(keras.callbacks.Callback):
    """Counts the training steps of each epoch."""

    def __init__(self, seen: list):
        super().__init__()
        self.seen = seen

    def on_epoch_begin(self, epoch, logs=None):
        self.seen.append(0)

    def on_train_batch_end(self, batch, logs=None):
        self.seen[-1] += 1


def test_checkpoints_of_another_model_are_set_aside_not_mixed(tmp_path, capsys):
    _fit(tiny_model(), Checkpoint(tmp_path), epochs=2)
    (tmp_path / COMPLETE).unlink()
    wider = tiny_model(classes=5)  # other shapes: nothing in the directory loads into it
    history = _fit(wider, Checkpoint(tmp_path), epochs=1)
    assert history.epoch == [0]
    assert "Moved 2 checkpoint(s) that cannot be resumed" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "previous").iterdir()) == [
        "ckpt-000000004.json",
        "ckpt-000000004.npz",
        "ckpt-000000008.json",
        "ckpt-000000008.npz",
    ]
    assert [read_header(p)["global_step"] for p in list_checkpoints(tmp_path)] == [STEPS]


def test_a_config_fingerprint_other_than_the_checkpoints_starts_fresh(tmp_path):
    _fit(tiny_model(), Checkpoint(tmp_path, metadata={"config": "aaaa"}), epochs=2)
    (tmp_path / COMPLETE).unlink()
    history = _fit(tiny_model(), Checkpoint(tmp_path, metadata={"config": "bbbb"}), epochs=3)
    assert history.epoch == [0, 1, 2]
    (tmp_path / COMPLETE).unlink()
    history = _fit(tiny_model(), Checkpoint(tmp_path, metadata={"config": "bbbb"}), epochs=4)
    assert history.epoch == [3]
