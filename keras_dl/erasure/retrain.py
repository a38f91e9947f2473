"""Train an affected version again from scratch, without the erased rows, through its gate.

The version's run logged its resolved config as the ``config.yaml`` artifact
(:mod:`keras_dl.tracking.mlflow_run`): it is read back with the recipe it names, and changed only where
the erasure needs it: no warm start (``model.init_from``: a warm start carries the erased rows'
influence), the whole table at its current version (``data.version``, or the version of each
``data.sources`` entry on the table; no ``since_version``, ``since_timestamp``, ``timestamp`` or
``replay``), a run folder of its own (the old one's
checkpoints trained on the rows), the same registered model, and no ``registry.set_alias``: the
aliases the affected version holds are moved here, each only when the new model passed the
recipe's registry gate (the trivial predictor, ``registry.min_metric``, ``registry.must_beat``)
and was registered by the recipe's normal path (:func:`keras_dl.run.finish.finish`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field

import yaml

from keras_dl.errors import ConfigError, KerasDLError
from keras_dl.lineage.query import same_table

RETRAINED_TAG = "keras_dl.retrained_without"  # on the new version: the erasure's tag value
REPLACES_TAG = "keras_dl.replaces"  # on the new version: models:/NAME/VERSION it replaces


@dataclass
class Outcome:
    """What retraining one affected version gave.

    Attributes:
        model, version, aliases: The affected version and the aliases it held.
        run_id: The new run (None when it could not start).
        new_version: The version registered (None when the gate refused the model or it failed).
        moved: The aliases moved to ``new_version``.
        reason: Why it was not registered, or the error that stopped it ("" when it was).
    """

    model: str
    version: int
    aliases: list[str]
    run_id: str | None = None
    new_version: int | None = None
    moved: list[str] = field(default_factory=list)
    reason: str = ""


def logged_config(client, model: str, version: int, run_id: str | None, into: str) -> str:
    """The path of the ``config.yaml`` the version's run logged, downloaded under ``into``.

    Raises:
        ConfigError: No run, or a run without ``config.yaml``, naming the version and the fix.
    """
    try:
        if not run_id:
            raise KeyError("no run")
        return client.download_artifacts(run_id, "config.yaml", into)
    except Exception as exc:  # MLflow raises several kinds for a missing artifact or run
        raise ConfigError(
            f"models:/{model}/{version} cannot be retrained: its run {run_id or '(none)'} has "
            f"no config.yaml artifact ({type(exc).__name__}: {exc}); keras_dl logs one for "
            "every run it trains. Retrain it with keras-dl train and the settings it was "
            "trained with (no model.init_from), then move its aliases with keras-dl promote."
        ) from exc


def config_reads(config: dict, table: str) -> bool:
    """Whether the logged ``config`` read ``table``: as ``data.table`` or a ``data.sources``
    entry's table."""
    data = config.get("data") or {}
    tables = [data.get("table"), *(s.get("table") for s in data.get("sources") or [])]
    return any(t and same_table(t) == same_table(table) for t in tables)


def logged_reads(client, model: str, version: int, run_id: str | None, table: str) -> bool:
    """Whether the config ``models:/model/version``'s run logged read ``table`` (for a version
    without row lineage: its config says which table it read, not which rows).

    Raises:
        ConfigError: No run or no ``config.yaml`` (:func:`logged_config`).
    """
    with (
        tempfile.TemporaryDirectory(prefix="keras_dl_retrain-") as tmp,
        open(logged_config(client, model, version, run_id, tmp)) as f,
    ):
        return config_reads(yaml.safe_load(f) or {}, table)


def retrain_settings(
    config: dict,
    model: str,
    version: int,
    table_version: int,
    tracking_uri: str | None,
    table: str | None = None,
) -> list[str]:
    """The ``--set`` overrides that make the logged ``config`` a from-scratch run on
    ``table_version`` of the erased ``table``, registering as ``model``.

    In a run mixed from ``data.sources``, each source on ``table`` reads ``table_version``
    and all of it (its own ``version`` and ``since_version`` would read rows the erasure
    removed since); ``data.version`` is set only when ``data.table`` is that table too.
    """
    data = config.get("data") or {}
    own = table is None or not data.get("table") or same_table(data["table"]) == same_table(table)
    sets = [
        "model.init_from=",
        *([f"data.version={table_version}"] if own else []),
        "data.timestamp=null",
        "data.since_version=null",
        "data.since_timestamp=null",
        "data.replay=null",
        f"runtime.run_dir={retrain_dir(config, version, table_version)}",
        f"tracking.registered_model={model}",
        "registry.set_alias=",
    ]
    if data.get("sources") and table is not None:
        sources = [dict(s) for s in data["sources"]]
        for s in sources:
            if same_table(s.get("table", "")) == same_table(table):
                s.update(version=table_version, since_version=None)
        sets.append(f"data.sources={json.dumps(sources)}")
    if tracking_uri:
        sets.append(f"tracking.uri={tracking_uri}")
    return sets


def retrain_dir(config: dict, version: int, table_version: int) -> str:
    """The run folder of version ``version``'s retraining on ``table_version``: its own, and
    the same in every call, so a call after a crash finds that retraining again."""
    run_dir = str((config.get("runtime") or {}).get("run_dir") or "runs").rstrip("/")
    return f"{run_dir}-without-erased-v{version}-t{table_version}"


def registered_earlier(client, model: str, version: int, run_dir: str) -> tuple[str, int] | None:
    """``(run_id, version)`` of the version of ``model``, newer than ``version``, that a
    retraining in ``run_dir`` registered: an earlier call stopped (a crash, a kill) after the
    gate passed it and before it was tagged and given the aliases. None when there is none."""
    for mv in client.search_model_versions(f"name = '{model}'"):
        if int(mv.version) <= version or not mv.run_id:
            continue
        try:
            params = client.get_run(mv.run_id).data.params
        except Exception:  # a version whose run is gone: not one of ours
            continue
        if params.get("runtime.run_dir") == run_dir:
            return mv.run_id, int(mv.version)
    return None


def retrain(
    client,
    model: str,
    version: int,
    aliases: Sequence[str],
    run_id: str | None,
    table_version: int,
    tracking_uri: str | None,
    tags: dict[str, str],
    extra_sets: Sequence[str] = (),
    table: str | None = None,
) -> Outcome:
    """Retrain ``models:/model/version`` from scratch on ``table_version``; on a registered
    model, tag it with ``tags`` and move each of ``aliases`` still on the old version to it.

    A version an earlier call's retraining registered (that call stopped before moving the
    aliases) is taken as it is, not trained again (:func:`registered_earlier`). An error while
    training (a diverged run, a bad setting, a crash of the recipe's own code) is the outcome's
    ``reason``, with its class: the other versions are still retrained, and the report says
    which failed and why.
    """
    out = Outcome(model, version, list(aliases))
    try:
        with tempfile.TemporaryDirectory(prefix="keras_dl_retrain-") as tmp:
            path = logged_config(client, model, version, run_id, tmp)
            with open(path) as f:
                config = yaml.safe_load(f) or {}
            earlier = registered_earlier(
                client, model, version, retrain_dir(config, version, table_version)
            )
            if earlier is not None:
                out.run_id, out.new_version = earlier
            else:
                sets = retrain_settings(config, model, version, table_version, tracking_uri, table)
                with contextlib.redirect_stdout(sys.stderr):  # stdout is the report (--json)
                    result = _train(config.get("recipe", ""), path, [*sets, *extra_sets])
    except KerasDLError as exc:
        out.reason = f"training failed: {exc}"
        return out
    except Exception as exc:  # not keras_dl's: reported with its class, the others go on
        out.reason = f"training failed: {type(exc).__name__}: {exc}"
        return out
    if out.new_version is None:
        out.run_id = result.run_id
        if result.registered_version is None:
            out.reason = result.not_registered or "the run registered no model version"
            return out
        out.new_version = int(result.registered_version)
    for key, value in tags.items():
        client.set_model_version_tag(model, str(out.new_version), key, value)
    held = client.get_registered_model(model).aliases or {}
    for alias in aliases:
        if str(held.get(alias)) == str(version):  # not moved by someone else meanwhile
            client.set_registered_model_alias(model, alias, str(out.new_version))
            out.moved.append(alias)
    return out


def _train(recipe_name: str, config_path: str, sets: list[str]):
    """Train the recipe as ``keras-dl train`` does (Horovod or multi-worker ranks too)."""
    from keras_dl.config import resolve
    from keras_dl.recipe import load_recipe
    from keras_dl.train import fit

    if not recipe_name:
        raise ConfigError(
            f"{config_path} names no recipe: it is not a config.yaml keras_dl logged."
        )
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    recipe = load_recipe(recipe_name)
    exp = resolve(recipe.defaults, config_path, sets)
    if exp.runtime.launches:
        from keras_dl.launch import launch

        return launch(exp)
    return fit(exp, recipe)
