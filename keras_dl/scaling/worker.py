"""One in-process setup (``1`` or ``mirrored:N``) of a scaling study, in a fresh process:
``python -m keras_dl.scaling.worker RECIPE CONFIG_YAML RUN_ID DEVICES``.

The study starts it so that every setup begins as the Horovod ranks do, with TensorFlow not yet
loaded: the devices are chosen before TensorFlow starts (the first ``DEVICES`` GPUs, or the CPU
split into ``DEVICES`` logical devices when there is no GPU), and no setup inherits another's
thread pools. It trains RECIPE with the saved experiment (a ``config.yaml`` from
:func:`keras_dl.config.dumps`) into the MLflow run ``RUN_ID`` the study created.
"""

from __future__ import annotations

import sys

ERROR_FILE = "error.txt"


def use_devices(devices: int) -> None:
    """Make exactly ``devices`` devices visible to TensorFlow (before it initializes)."""
    import tensorflow as tf

    from keras_dl.distribute.strategy import use_logical_cpus

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        if devices > len(gpus):
            from keras_dl.errors import DistributedError

            raise DistributedError(
                f"The setup asks for {devices} devices, but this host has {len(gpus)} GPUs. "
                f"Use mirrored:{len(gpus)} or fewer."
            )
        tf.config.set_visible_devices(gpus[:devices], "GPU")
    elif devices > 1:
        use_logical_cpus(devices)


def main(argv: list[str]) -> int:
    """Train; a keras_dl error is printed, written to ``ERROR_FILE`` beside the config (the
    study raises it again, with its exit code), and ends the process with that code."""
    from pathlib import Path

    from keras_dl.errors import KerasDLError

    recipe, config, run_id, devices = argv
    try:
        return _train(recipe, config, run_id, int(devices))
    except KerasDLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        Path(config).with_name(ERROR_FILE).write_text(str(exc), encoding="utf-8")
        return exc.exit_code


def _train(name: str, config: str, run_id: str, devices: int) -> int:
    from keras_dl.config import resolve
    from keras_dl.recipe import load_recipe
    from keras_dl.train import fit

    recipe = load_recipe(name)
    exp = resolve(recipe.defaults, config)
    use_devices(devices)
    fit(exp, recipe, run_id=run_id)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
