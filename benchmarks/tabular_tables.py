"""The tables of ``keras-dl bench tabular``: scikit-learn's bundled ones and generated ones.

Each table is a pandas frame with a ``label`` column, its task, and its accuracy margin (or RMSE
ratio). The generated tables come from :func:`sklearn.datasets.make_classification` and
:func:`~sklearn.datasets.make_regression` with a fixed ``random_state``, each made odd in one way
that a default model meets in real tables:

- ``classes10``: 10 classes, 2,000 rows;
- ``imbalanced``: two classes at 1:20, 3,000 rows;
- ``noisy``: 40 columns of which 6 are informative, 10 redundant (linear mixes) and 24 noise,
  5 % of the labels flipped, 1,000 rows;
- ``strings``: 3 of 8 columns cut into string categories (``c0`` ... ``c5``), 1,500 rows;
- ``missing``: 10 % of the values of 4 of 10 columns missing (NaN), 1,500 rows;
- ``regression``: 20 columns (10 informative), Gaussian noise, 1,000 rows;
- ``tiny``: 100 rows, 3 classes; ``large``: 100,000 rows, 3 classes.

``quick`` caps every generated table at 400 rows (the test's setting; ``large`` too).
"""

from __future__ import annotations

from dataclasses import dataclass

BUNDLED = ("iris", "diabetes", "digits")
GENERATED = (
    "classes10",
    "imbalanced",
    "noisy",
    "strings",
    "missing",
    "regression",
    "tiny",
    "large",
)
DATASETS = BUNDLED + GENERATED
QUICK_ROWS = 400


@dataclass(frozen=True)
class Generated:
    """How to generate one table: rows, and the make_classification/make_regression options."""

    rows: int
    regression: bool = False
    options: tuple = ()  # (name, value) pairs
    strings: int = 0  # leading columns cut into string categories
    missing: int = 0  # leading columns (after the string ones) with 10 % NaN


TABLES = {
    "classes10": Generated(
        2000, options=(("n_features", 20), ("n_informative", 10), ("n_classes", 10))
    ),
    "imbalanced": Generated(
        3000, options=(("n_features", 10), ("n_informative", 5), ("weights", (20 / 21,)))
    ),
    "noisy": Generated(
        1000,
        options=(
            ("n_features", 40),
            ("n_informative", 6),
            ("n_redundant", 10),
            ("flip_y", 0.05),
        ),
    ),
    "strings": Generated(1500, options=(("n_features", 8), ("n_informative", 5)), strings=3),
    "missing": Generated(1500, options=(("n_features", 10), ("n_informative", 6)), missing=4),
    "regression": Generated(
        1000, regression=True, options=(("n_features", 20), ("n_informative", 10), ("noise", 10))
    ),
    "tiny": Generated(100, options=(("n_features", 6), ("n_informative", 4), ("n_classes", 3))),
    "large": Generated(
        100_000, options=(("n_features", 20), ("n_informative", 10), ("n_classes", 3))
    ),
}


def load_frame(name: str, quick: bool = False):
    """The table as a pandas frame with a ``label`` column, and its task."""
    if name in BUNDLED:
        return _bundled(name)
    return generate(TABLES[name], quick)


def generate(spec: Generated, quick: bool = False):
    """One generated table (fixed ``random_state``, so every run sees the same rows)."""
    import numpy as np
    import pandas as pd
    from sklearn import datasets

    rows = min(spec.rows, QUICK_ROWS) if quick else spec.rows
    options = dict(spec.options)
    if spec.regression:
        x, y = datasets.make_regression(rows, random_state=0, **options)
        y, task = y.astype(np.float64), "regression"
    else:
        x, y = datasets.make_classification(rows, random_state=0, **options)
        y, task = y.astype(np.int64), "classification"
    frame = pd.DataFrame(x, columns=[f"x{i}" for i in range(x.shape[1])])
    for i in range(spec.strings):  # six categories by quantile: the order is in the names only
        cut = np.quantile(x[:, i], np.linspace(0, 1, 7)[1:-1])
        codes = np.random.default_rng(i).permutation(6)[np.searchsorted(cut, x[:, i])]
        frame[f"x{i}"] = np.array([f"c{c}" for c in codes], dtype=object)
    rng = np.random.default_rng(0)
    for i in range(spec.strings, spec.strings + spec.missing):
        frame.loc[rng.random(rows) < 0.1, f"x{i}"] = np.nan
    return frame.assign(label=y), task


def _bundled(name: str):
    import numpy as np
    import pandas as pd
    from sklearn import datasets

    if name == "iris":
        d = datasets.load_iris()
        cols = [c.replace(" (cm)", "").replace(" ", "_") for c in d.feature_names]
        frame, task = pd.DataFrame(d.data, columns=cols), "classification"
    elif name == "diabetes":
        d = datasets.load_diabetes(scaled=False)
        frame, task = pd.DataFrame(d.data, columns=d.feature_names), "regression"
    else:
        d = datasets.load_digits()
        frame = pd.DataFrame(d.data.astype(np.int64), columns=[f"px{i}" for i in range(64)])
        task = "classification"
    label = d.target.astype(np.int64 if task == "classification" else np.float64)
    return frame.assign(label=label), task


def baseline(base: str, task: str, x, seed: int):
    """An unfitted scikit-learn pipeline for ``x``'s columns: ``linear`` (LogisticRegression /
    Ridge on mean-imputed, standardized numbers and one-hot strings) or ``hgb``
    (HistGradientBoosting, strings as categories, NaN as it handles them)."""
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler

    classify = task == "classification"
    strings = [c for c in x.columns if x[c].dtype == object]
    numbers = [c for c in x.columns if c not in strings]
    if base == "linear":
        prep = ColumnTransformer(
            [
                ("num", make_pipeline(SimpleImputer(), StandardScaler()), numbers),
                ("str", OneHotEncoder(handle_unknown="ignore"), strings),
            ]
        )
        return make_pipeline(prep, LogisticRegression(max_iter=5000) if classify else Ridge())
    hgb = HistGradientBoostingClassifier if classify else HistGradientBoostingRegressor
    if not strings:
        return hgb(random_state=seed)
    prep = ColumnTransformer(
        [("str", OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=-1), strings)],
        remainder="passthrough",
    )
    return make_pipeline(
        prep, hgb(random_state=seed, categorical_features=list(range(len(strings))))
    )
