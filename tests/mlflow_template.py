"""New SQLite MLflow stores start as a copy of an empty one already migrated.

MLflow builds a new SQLite store by running all its Alembic migrations (measured 13-29 s a store
at load 20 on 2 cores, about 1 CPU-s on a quiet one; 0.07 s for a copy), and most tests make a
fresh store: in their own process (``tests/conftest.py``) or in a command they start (the CLI,
the recipes, Horovod's ranks), which forks from the warm interpreter
(``tests/warm_python_server.py``). Each of those processes builds the template once with
:func:`build` and :func:`install` s it; a store file that does not exist yet is then a copy of
it. The template holds no experiment: MLflow still creates the Default experiment itself, with
the store's own artifact root. Commands that run cold build their stores as MLflow does.
"""

from __future__ import annotations

import functools
import os
import shutil
import sqlite3
import uuid
from pathlib import Path

_TEMPLATE: list = [None]  # the installed template's path


def build(folder: Path) -> Path:
    """An empty, fully migrated SQLite store in ``folder`` (made by MLflow itself)."""
    import mlflow.store.tracking.sqlalchemy_store as tracking

    folder.mkdir(parents=True, exist_ok=True)
    store = tracking.SqlAlchemyStore(f"sqlite:///{folder / 'build.db'}", (folder / "art").as_uri())
    store.engine.dispose()  # no connection left open (the warm server forks after this)
    with sqlite3.connect(folder / "build.db") as db:
        db.execute("DELETE FROM experiments")
    db.close()
    (folder / "build.db").rename(folder / "template.db")
    return folder / "template.db"


def install(template: Path):
    """Seed every new ``sqlite:///`` store this process's MLflow opens from ``template``;
    returns the function that undoes it."""
    import mlflow.store.model_registry.sqlalchemy_store as registry
    import mlflow.store.tracking.sqlalchemy_store as tracking

    _TEMPLATE[0] = template
    originals = [
        (cls, cls.__init__) for cls in (tracking.SqlAlchemyStore, registry.SqlAlchemyStore)
    ]
    for cls, init in originals:
        cls.__init__ = _seeding(init)

    def uninstall() -> None:
        for cls, init in originals:
            cls.__init__ = init
        _TEMPLATE[0] = None

    return uninstall


def _seeding(init):
    @functools.wraps(init)
    def wrapper(self, db_uri, *args, **kwargs):
        if db_uri.startswith("sqlite:///"):
            seed_store(db_uri)
        init(self, db_uri, *args, **kwargs)

    return wrapper


def seed_store(store: str | os.PathLike) -> str:
    """Make the SQLite store ``store`` (a ``sqlite:///`` URI or a path) a copy of the migrated
    empty template, unless it exists already or none is installed. Returns its URI."""
    text = os.fspath(store)
    db = Path(text[len("sqlite:///") :] if text.startswith("sqlite:///") else text)
    uri = f"sqlite:///{db}"
    template = _TEMPLATE[0]
    if template is None or db.exists() or not db.parent.is_dir():
        return uri
    part = db.with_name(f".{db.name}.{uuid.uuid4().hex}")
    shutil.copyfile(template, part)
    try:
        os.link(part, db)  # atomic, and never over a store another process just made
    except FileExistsError:
        pass
    finally:
        part.unlink()
    return uri
