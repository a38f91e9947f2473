"""`keras-dl recipes` lists every recipe with its description and main defaults."""

from keras_dl.recipe import list_recipes
from tests.conftest import cli_in_process


def test_recipes_lists_every_recipe_with_defaults():
    proc = cli_in_process("recipes")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for name in list_recipes():
        assert any(line.startswith(f"{name} ") for line in out.splitlines()), out
    assert "transfer learning (MobileNetV2 default)" in out
    assert "backbone=MobileNetV2" in out and "weights=imagenet" in out
    assert "MLP for any Delta/Parquet table" in out and "task=auto" in out
    assert "epochs=auto batch_size=auto" in out and "table=-" in out
