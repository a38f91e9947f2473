"""Registry and lineage: what a registered version carries, ``keras-dl promote``, loading by alias."""

import mlflow
import numpy as np
import pytest
import yaml
from sklearn.datasets import load_digits

from keras_dl.errors import KerasDLError
from keras_dl.model.registry import promote, read_lineage, resolve_model_uri
from tests.conftest import cli_in_process, run_cli, seed_store


@pytest.mark.slow
def test_registered_version_carries_its_lineage(digits_model, digits_table):
    uri, result = digits_model
    lineage = read_lineage("digits", 1, uri)
    tags = lineage.tags
    assert tags["data.table"] == digits_table and tags["data.version"] == "0"
    assert tags["keras_dl.recipe"] == "digits" and tags["run_id"] == result.run_id
    assert len(tags["mlflow.source.git.commit"]) == 40
    assert float(tags["metric.test_accuracy"]) == pytest.approx(
        result.metrics["test_accuracy"], rel=1e-5
    )
    # The description holds the resolved config, and the run holds it as config.yaml.
    config = yaml.safe_load(lineage.description.split("artifacts):", 1)[1])
    assert config["recipe"] == "digits" and config["train"]["epochs"] == 4
    path = mlflow.artifacts.download_artifacts(
        run_id=result.run_id, artifact_path="config.yaml", tracking_uri=uri
    )
    with open(path) as f:
        assert yaml.safe_load(f)["data"]["table"] == digits_table


@pytest.mark.slow
def test_promote_from_the_cli_then_load_by_alias(digits_model, tmp_path):
    uri, result = digits_model
    proc = run_cli("promote", "digits", "1", "--alias", "champion", "--tracking-uri", uri)
    assert proc.returncode == 0, proc.stderr
    assert "models:/digits@champion -> version 1" in proc.stdout
    assert f"run {result.run_id}" in proc.stdout
    assert resolve_model_uri("models:/digits@champion", uri).version == 1
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model("models:/digits@champion")
    digits = load_digits()
    probs = np.asarray(model.predict(digits.data[:50]))
    np.testing.assert_allclose(probs, result.model.predict(digits.data[:50], verbose=0), atol=1e-5)


@pytest.mark.slow
def test_promote_errors_name_what_exists(digits_model):
    uri, _ = digits_model
    with pytest.raises(KerasDLError, match=r"no version 7 \(its versions: 1\)"):
        promote("digits", 7, tracking_uri=uri)
    with pytest.raises(KerasDLError, match=r"no registered model 'digitz'.*registered: digits"):
        promote("digitz", 1, tracking_uri=uri)
    with pytest.raises(KerasDLError, match="'latest' is reserved"):
        promote("digits", 1, alias="latest", tracking_uri=uri)
    with pytest.raises(KerasDLError, match="has no alias 'nope'"):
        resolve_model_uri("models:/digits@nope", uri)
    with pytest.raises(KerasDLError, match="models:/NAME/VERSION"):
        resolve_model_uri("runs:/abc/model", uri)


def test_promote_cli_on_an_empty_store_is_a_clear_error(tmp_path):
    uri = seed_store(f"sqlite:///{tmp_path / 'mlflow.db'}")
    proc = cli_in_process("promote", "digits", "1", "--tracking-uri", uri)
    assert proc.returncode == 2
    assert "no registered model 'digits'" in proc.stderr and "Traceback" not in proc.stderr
