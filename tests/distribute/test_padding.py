"""A padded batch (real rows, then copies of them at sample weight 0) trains as its real rows
alone under the losses keras_dl compiles (:func:`keras_dl.model.compile_options.weigh_rows`)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_dl.distribute.padding import RealRowsMean, exclude_padding
from keras_dl.model.compile_options import compile_weighted

REAL, PAD = 5, 3  # a last batch of 8 slots: 5 real rows, 3 padding copies


def _batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(REAL, 4)).astype(np.float32)
    y = rng.integers(0, 3, size=REAL)
    take = np.arange(PAD) % REAL  # as weigh_and_pad copies them: the first rows again
    weights = np.r_[np.ones(REAL), np.zeros(PAD)].astype(np.float32)
    return x, y, np.r_[x, x[take]], np.r_[y, y[take]], weights


def _model(heads=("label",), batch_norm=False):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(6, activation="relu")(inputs)
    if batch_norm:
        hidden = keras.layers.BatchNormalization(momentum=0.5)(hidden)
    outputs = {h: keras.layers.Dense(3, activation="softmax", name=h)(hidden) for h in heads}
    return keras.Model(inputs, outputs if len(heads) > 1 else outputs[heads[0]])


def _gradients(model, loss, x, y, weights=None, weighted=True):
    """The gradients of the compiled loss, compiled as keras_dl compiles it."""
    compile_weighted(model, {"optimizer": "sgd", "loss": loss, "metrics": ["mae"]}, weighted)
    with tf.GradientTape() as tape:
        y_pred = model(x, training=True)
        value = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=weights)
    return [g.numpy() for g in tape.gradient(value, model.trainable_weights)]


def _assert_same(got, expected):
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-7)


LOSSES = {
    "name": "sparse_categorical_crossentropy",
    "loss_object": keras.losses.SparseCategoricalCrossentropy(),
    "function": keras.losses.sparse_categorical_crossentropy,
    "custom_function": lambda y, p: keras.losses.sparse_categorical_crossentropy(y, p) * 2.0,
}


@pytest.mark.parametrize("loss", LOSSES.values(), ids=LOSSES.keys())
def test_a_padded_batch_gives_the_gradient_of_its_real_rows_alone(loss):
    x, y, x_pad, y_pad, w = _batch()
    model = _model()
    alone = _gradients(model, loss, x, y, weighted=False)  # one process: no padding, no weights
    padded = _gradients(model, loss, x_pad, y_pad, w)
    _assert_same(padded, alone)
    # Keras' default reduction (what keras_dl compiled before) divides by all 8 slots.
    before = _gradients(model, loss, x_pad, y_pad, w, weighted=False)
    np.testing.assert_allclose(before[-1], alone[-1] * REAL / (REAL + PAD), rtol=1e-5, atol=1e-7)


def test_one_loss_per_output_head_each_leaves_the_padding_out():
    x, y, x_pad, y_pad, w = _batch()
    heads = ("a", "b")
    loss = {"a": "sparse_categorical_crossentropy", "b": keras.losses.MeanSquaredError()}
    model = _model(heads)
    alone = _gradients(model, loss, x, {"a": y, "b": np.eye(3)[y]}, weighted=False)
    padded = _gradients(model, loss, x_pad, {"a": y_pad, "b": np.eye(3)[y_pad]}, w)
    _assert_same(padded, alone)


def test_user_weights_keep_their_meaning_and_a_zero_weight_row_counts_as_absent():
    x, y, x_pad, y_pad, w = _batch()
    user = np.array([1.0, 2.0, 0.5, 1.0, 3.0], np.float32)
    model = _model()
    loss = "sparse_categorical_crossentropy"
    # Positive weights: Keras' own semantics, sum(w * loss) / rows, padded or not.
    alone = _gradients(model, loss, x, y, user, weighted=False)
    padded = _gradients(model, loss, x_pad, y_pad, np.r_[user, np.zeros(PAD, np.float32)])
    _assert_same(padded, alone)
    # A real row at weight 0 leaves the batch's mean too: as if it were not in the batch.
    zeroed = np.r_[0.0, user[1:]].astype(np.float32)
    without = _gradients(model, loss, x[1:], y[1:], user[1:], weighted=False)
    _assert_same(_gradients(model, loss, x, y, zeroed), without)


def test_the_saved_model_records_the_recipes_loss_and_loads_without_keras_dl(tmp_path):
    import json

    x, y, x_pad, y_pad, w = _batch()
    model = _model()
    compile_weighted(model, {"optimizer": "sgd", "loss": "sparse_categorical_crossentropy"}, True)
    model.train_on_batch(x_pad, y_pad, sample_weight=w)
    assert isinstance(model.loss, RealRowsMean)  # what trains
    assert "RealRowsMean" not in json.dumps(model.get_compile_config())  # what is saved
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert loaded.loss == "sparse_categorical_crossentropy"


def test_a_batch_of_padding_alone_moves_nothing():
    x, y, *_ = _batch()
    grads = _gradients(_model(), "sparse_categorical_crossentropy", x, y, np.zeros(REAL))
    assert all(not np.any(g) for g in grads)


def test_other_reductions_and_none_are_left_as_the_recipe_gave_them():
    summed = keras.losses.MeanSquaredError(reduction="sum")
    assert exclude_padding(summed) is summed and exclude_padding(None) is None
    wrapped = exclude_padding(["mse"])[0]
    assert isinstance(wrapped, RealRowsMean) and exclude_padding(wrapped) is wrapped
    again = RealRowsMean.from_config(wrapped.get_config())
    assert again.name == wrapped.name == "mean_squared_error"
    with pytest.raises(ValueError, match="'no_such_loss' is not a Keras loss"):
        exclude_padding("no_such_loss")


def test_unequal_real_rows_over_ranks_average_the_ranks_means():
    """Horovod averages the ranks' gradients: each rank's is the mean over its real rows, so
    with unequal real rows the step is the mean of the ranks' means, not the mean over all
    real rows (exact when the ranks' real rows are equal, which every step but the last is)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(9, 4)).astype(np.float32)
    y = rng.integers(0, 3, size=9)
    model = _model()
    loss = "sparse_categorical_crossentropy"
    ranks = [(x[:5], y[:5]), (x[5:], y[5:])]  # 5 and 4 real rows, 5 slots each
    means = [_gradients(model, loss, xr, yr, weighted=False) for xr, yr in ranks]
    padded = []
    for xr, yr in ranks:
        pad = 5 - len(xr)
        w = np.r_[np.ones(len(xr)), np.zeros(pad)].astype(np.float32)
        padded.append(_gradients(model, loss, np.r_[xr, xr[:pad]], np.r_[yr, yr[:pad]], w))
    averaged = [(a + b) / 2 for a, b in zip(*padded)]
    _assert_same(averaged, [(a + b) / 2 for a, b in zip(*means)])
    everything = _gradients(model, loss, x, y, weighted=False)
    gap = np.abs(averaged[-1] - everything[-1]).max() / np.abs(everything[-1]).max()
    print(f"mean of the ranks' means vs the mean over all real rows: {gap:.2%} apart")
    assert gap > 1e-4


def test_padding_copies_still_move_batch_normalization_statistics():
    """BatchNormalization ignores sample weights: in training mode the copies join the batch's
    mean and variance, so they move its moving statistics (and the normalization of the real
    rows of that one batch). What keras_dl's README says padding still touches."""
    x, y, x_pad, y_pad, w = _batch()
    stats = []
    for xs, ys, ws in ((x, y, None), (x_pad, y_pad, w)):
        model = _model(batch_norm=True)
        compile_weighted(model, {"optimizer": "sgd", "loss": "mse"}, ws is not None)
        model.train_on_batch(xs, np.eye(3)[ys], sample_weight=ws)
        bn = next(
            layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)
        )
        stats.append(bn.moving_mean.numpy())
    assert not np.allclose(stats[0], stats[1]), stats
