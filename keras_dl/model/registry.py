"""Promote a registered model version to an alias (``keras-dl promote NAME VERSION --alias champion``).

Callers then load ``models:/NAME@champion`` and never hard-code a version number. Every version
registered by ``keras_dl.train.fit`` carries its lineage as tags (``data.table``,
``data.version``, ``keras_dl.recipe``, ``run_id``, ``mlflow.source.git.commit``, ``metric.*``)
and its resolved config in its description; :func:`read_lineage` returns them.

Example:
    >>> from keras_dl.model.registry import promote
    >>> promote("digits", 3, alias="champion")            # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any

from keras_dl import tracking
from keras_dl.config import MODEL_URI, valid_alias
from keras_dl.errors import KerasDLError


@dataclass(frozen=True)
class Lineage:
    """Where a registered version came from."""

    name: str
    version: int
    run_id: str
    source: str
    tags: dict[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    description: str = ""

    def __str__(self) -> str:
        t = self.tags
        return (
            f"models:/{self.name}/{self.version} (aliases: {', '.join(self.aliases) or 'none'}): "
            f"recipe {t.get('keras_dl.recipe', '?')}, data {t.get('data.table', '?')} version "
            f"{t.get('data.version') or 'n/a'}, run {self.run_id}, git "
            f"{t.get('mlflow.source.git.commit', 'unknown')[:12]}"
        )


def promote(name: str, version: int, alias: str = "champion", tracking_uri: str | None = None):
    """Point ``alias`` of registered model ``name`` at ``version``.

    Args:
        name: Registered model name.
        version: The version to promote.
        alias: The alias. Defaults to "champion".
        tracking_uri: MLflow tracking URI. Defaults to ``$MLFLOW_TRACKING_URI`` or
            ``sqlite:///mlflow.db`` in the working directory.

    Returns:
        The promoted version's :class:`Lineage`.

    Raises:
        KerasDLError: When the model or the version does not exist (listing what does).
    """
    client = _client(tracking_uri)
    if not valid_alias(alias):
        raise KerasDLError(
            f"Alias {alias!r} is not valid: use letters, digits, '_' or '-', starting with a "
            "letter ('latest' is reserved by MLflow), e.g. --alias champion."
        )
    _check_version(client, name, version)
    client.set_registered_model_alias(name, alias, str(version))
    return read_lineage(name, version, tracking_uri)


def read_lineage(name: str, version: int, tracking_uri: str | None = None) -> Lineage:
    """The tags, run, aliases and description of one registered version."""
    client = _client(tracking_uri)
    mv = _check_version(client, name, version)
    return Lineage(
        name=name,
        version=int(mv.version),
        run_id=mv.run_id or "",
        source=mv.source or "",
        tags=dict(mv.tags or {}),
        aliases=tuple(getattr(mv, "aliases", ()) or ()),
        description=mv.description or "",
    )


def resolve_model_uri(model_uri: str, tracking_uri: str | None = None) -> Lineage:
    """The registered version that ``models:/NAME/N`` or ``models:/NAME@ALIAS`` points at now.

    Raises:
        KerasDLError: For a URI of another form, an unknown model, version or alias.
    """
    match = MODEL_URI.match(model_uri)
    if not match:
        raise KerasDLError(
            f"Model URI {model_uri!r} is not of the form models:/NAME/VERSION or "
            "models:/NAME@ALIAS (for example models:/digits@champion)."
        )
    name, version, alias = match.group("name", "version", "alias")
    client = _client(tracking_uri)
    if version is not None:
        return read_lineage(name, int(version), tracking_uri)
    _check_model(client, name)
    try:
        mv = client.get_model_version_by_alias(name, alias)
    except Exception:
        aliases = sorted(getattr(client.get_registered_model(name), "aliases", {}) or {})
        raise KerasDLError(
            f"Registered model {name!r} has no alias {alias!r} (its aliases: "
            f"{', '.join(aliases) or 'none'}). Set one with `keras-dl promote {name} VERSION "
            f"--alias {alias}`."
        ) from None
    return read_lineage(name, int(mv.version), tracking_uri)


def load_keras_model(uri: str):
    """The Keras model of a registered version (Keras flavor, or keras_dl's pyfunc loader).

    Args:
        uri: A pinned ``models:/NAME/VERSION`` (resolve an alias with :func:`resolve_model_uri`).
    """
    if "keras" in tracking.model_flavors(uri):
        return tracking.load_keras_model(uri)
    return tracking.load_pyfunc_model(uri).get_raw_model()


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``keras-dl promote`` arguments."""
    p.add_argument("name", help="registered model name, e.g. digits")
    p.add_argument("version", type=int, help="the version to promote")
    p.add_argument("--alias", default="champion", help="alias to set (default: champion)")
    p.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)",
    )


def run(args: argparse.Namespace) -> int:
    """``keras-dl promote``: set the alias and print the version's lineage."""
    lineage = promote(args.name, args.version, args.alias, args.tracking_uri)
    print(f"models:/{args.name}@{args.alias} -> version {args.version}")
    print(f"lineage: {lineage}")
    return 0


def _client(tracking_uri: str | None) -> Any:
    from keras_dl.config import default_tracking_uri

    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()
    tracking.set_tracking_uri(uri)  # so that models:/ URIs resolve against the same store
    return tracking.client(uri)


def _check_model(client: Any, name: str) -> None:
    try:
        client.get_registered_model(name)
    except Exception:
        names = sorted(m.name for m in client.search_registered_models())
        raise KerasDLError(
            f"There is no registered model {name!r} in {client.tracking_uri} (registered: "
            f"{', '.join(names) or 'none'}). Train one, or pass --tracking-uri for another store."
        ) from None


def _check_version(client: Any, name: str, version: int):
    _check_model(client, name)
    try:
        return client.get_model_version(name, str(version))
    except Exception:
        versions = sorted(int(v.version) for v in client.search_model_versions(f"name='{name}'"))
        raise KerasDLError(
            f"Registered model {name!r} has no version {version} (its versions: "
            f"{', '.join(map(str, versions)) or 'none'}). Pick one of them."
        ) from None
