"""What a recipe is, and how one is found by name.

A recipe is a module ``recipes/NAME.py`` that defines ``RECIPE = Recipe(...)``: the model, its
loss and metrics, the kinds of columns it reads, optional vectorized tf.data preprocessing, and
its default experiment. The module system is the registry: ``load_recipe("digits")`` imports
``recipes.digits``.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from keras_dl.config import CHOSEN_BY_RECIPE, Experiment
from keras_dl.data.stream.features import NUMERIC
from keras_dl.errors import ConfigError


@dataclass(frozen=True)
class Recipe:
    """A Keras model plus its defaults.

    Args:
        name: The module name under ``recipes/``.
        description: One line for ``keras-dl recipes``.
        defaults: The default experiment (``recipe`` set to ``name``).
        build_model: ``fn(data: DataSplits, exp: Experiment) -> keras.Model`` (not compiled),
            called inside the strategy's scope.
        loss: A Keras loss. Defaults to sparse categorical cross-entropy.
        metrics: Keras metrics. Defaults to ("accuracy",).
        compile_options: ``fn(data, exp) -> {"loss": ..., "metrics": [...]}`` for recipes whose
            loss depends on the data (regression vs classification). It may also give an
            ``"optimizer"`` instance, used as it is: ``train.optimizer``, ``learning_rate``,
            ``lr_schedule`` and ``runtime.lr_scaling`` then do not apply. Defaults to None.
        accept: Feature kinds the model consumes. Defaults to numeric only.
        preprocess: Vectorized ``fn(features, label)`` run in tf.data on every split.
            Defaults to None.
        preprocess_train: Replaces ``preprocess`` on the training split (augmentation).
            Defaults to None.
        prepare: ``fn(exp) -> Recipe`` called once by ``fit`` before any data is read, for
            recipes that adapt to the table (e.g. the classes of a string label, mapped to
            integers in ``preprocess``). Defaults to None.
        configure: ``fn(exp) -> Experiment`` that fills in the settings the recipe chooses
            from the table, those its defaults leave null (``train.batch_size``,
            ``train.epochs``); see :func:`configure`. Defaults to None.
        check: ``fn(exp)`` that checks the model's settings against the table and raises
            :class:`~keras_dl.errors.ConfigError`, e.g. :func:`check_num_classes`. ``fit`` and
            the Horovod launcher call it before any MLflow run starts (the ranges of the
            ``model`` fields are checked earlier, when the config is resolved). Defaults to None.
        heads: The model can have several labels (``data.label`` a list), one output head
            each. Defaults to False: a second label is refused before any run starts.
        example: ``fn(folder) -> (table, sets)``: writes a small table the recipe trains on
            under ``folder``, offline, and returns it with the ``--set`` items of a quick run
            (``recipes/_examples.py``). The suite trains every listed recipe on its example.
            Defaults to None (a recipe without one fails that test).
    """

    name: str
    description: str
    defaults: Experiment
    build_model: Callable[..., Any]
    loss: Any = "sparse_categorical_crossentropy"
    metrics: Any = ("accuracy",)
    compile_options: Callable | None = None
    accept: tuple[str, ...] = (NUMERIC,)
    preprocess: Callable | None = None
    preprocess_train: Callable | None = None
    prepare: Callable | None = None
    configure: Callable | None = None
    check: Callable | None = None
    heads: bool = False
    example: Callable[[str], tuple[str, tuple[str, ...]]] | None = None


def configure(exp: Experiment, recipe: Recipe) -> Experiment:
    """``exp`` with the settings ``recipe`` chooses from the table filled in.

    ``fit`` (and the Horovod launcher, before it logs the config) calls this first, so the
    values chosen are the ones trained with, written to ``config.yaml`` and logged as params.
    A recipe's ``configure`` only fills what is still null, so a second call changes nothing.

    Raises:
        ConfigError: When a setting is still null afterwards (the recipe has no rule for it).
    """
    if recipe.configure is not None:
        exp = recipe.configure(exp)
    for key in CHOSEN_BY_RECIPE:
        section, name = key.split(".")
        if getattr(getattr(exp, section), name) is None:
            raise ConfigError(
                f"{key} is null and recipe {recipe.name!r} does not choose it from the table. "
                f"Set it, for example --set {key}=10."
            )
    return exp


def check_model(exp: Experiment, recipe: Recipe) -> None:
    """Run ``recipe.check`` on ``exp``: what the ``model`` settings need from the table, checked
    before any run starts (see :class:`Recipe`), and that the recipe takes as many labels.

    Raises:
        ConfigError: For several labels in ``data.label`` when the recipe has one output.
    """
    labels = exp.data.labels
    if len(labels) > 1 and not recipe.heads:
        raise ConfigError(
            f"data.label names {len(labels)} columns ({', '.join(labels)}), but recipe "
            f"{recipe.name!r} has one output. Set data.label to one column, or train a recipe "
            "with one head per label (tabular)."
        )
    if recipe.check is not None:
        recipe.check(exp)


def check_num_classes(exp: Experiment) -> None:
    """A classifier's ``model.num_classes`` against its integer labels (``0`` to ``K-1`` need
    ``K`` outputs at least), in every row of ``data.table`` (all splits, ``data.filters``
    applied) and of ``data.validation_table`` / ``data.test_table``. Only the label column is
    read.

    Raises:
        ConfigError: Naming ``model.num_classes``, its value, the table, the label values found
            and the smallest value that fits them.
    """
    from keras_dl.data.labels import integer_label_range

    data, wanted = exp.data, exp.model.num_classes
    tables = [(data.table, data.version, data.timestamp)]
    tables += [(t, None, None) for t in (data.validation_table, data.test_table) if t]
    for table, version, timestamp in tables:
        found = integer_label_range(data, table, version, timestamp)
        if found is None or (found.low >= 0 and found.high < wanted):
            continue
        if found.low < 0:
            raise ConfigError(
                f"Label column {found.column!r} of table {found.table!r} holds {found.low}: a "
                f"classifier's labels run from 0 to model.num_classes-1 ({wanted - 1}). Map the "
                "labels to 0..K-1 in the table, or set data.label to another column."
            )
        raise ConfigError(
            f"model.num_classes={wanted} is too few for table {found.table!r}: its label column "
            f"{found.column!r} holds {found.distinct} distinct values from {found.low} to "
            f"{found.high}, and the model needs one output per value from 0 to {found.high}. "
            f"Set --set model.num_classes={found.high + 1} (the allowed range is >= "
            f"{found.high + 1} for this table)."
        )


def load_recipe(name: str) -> Recipe:
    """Import ``recipes.NAME`` (or the module a dotted ``NAME`` names) and return its ``RECIPE``.

    A dotted name such as ``mypkg.recipes.churn`` is a recipe in a package of the user's own,
    imported as it is; the recipe's default experiment then names it so (``recipe`` is the
    dotted name), so Horovod ranks, Spark tasks and resumes load the same module.

    Raises:
        ConfigError: When there is no such recipe, listing the ones there are.
    """
    if not all(part.isidentifier() for part in name.split(".")):
        raise ConfigError(
            f"Recipe name {name!r} is not valid: use a module under recipes/ ("
            f"{', '.join(list_recipes())}) or a dotted module path such as mypkg.recipes.churn."
        )
    module = _import_recipe(name)
    recipe = getattr(module, "RECIPE", None)
    if not isinstance(recipe, Recipe):
        where = f"recipes/{name}.py" if "." not in name else f"Module {name!r}"
        raise ConfigError(f"{where} does not define RECIPE = Recipe(...).")
    if "." in name and recipe.defaults.recipe != name:
        recipe = dataclasses.replace(
            recipe, defaults=dataclasses.replace(recipe.defaults, recipe=name)
        )
    return recipe


def list_recipes() -> list[str]:
    """Names of the modules in the ``recipes`` package."""
    import recipes

    return sorted(
        m.name for m in pkgutil.iter_modules(recipes.__path__) if not m.name.startswith("_")
    )


def _import_recipe(name: str):
    """The module of recipe ``name``: ``recipes.NAME``, or a dotted path as it is."""
    module_name = name if "." in name else f"recipes.{name}"
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if not (module_name == missing or module_name.startswith(missing + ".")):
            raise  # the recipe exists and one of its own imports is missing
        if "." in name:
            raise ConfigError(
                f"There is no module {name!r} to load the recipe from ({missing!r} is not "
                "importable). Install the package that holds it, or run from the folder "
                "that contains it; built-in recipes: "
                f"{', '.join(list_recipes())}."
            ) from None
        raise ConfigError(
            f"There is no recipe {name!r}. Recipes: {', '.join(list_recipes())} "
            f"(or add recipes/{name}.py defining RECIPE, or name a module of your own package, "
            "e.g. mypkg.recipes.churn)."
        ) from None
