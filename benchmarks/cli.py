"""``keras-dl bench ...``: the benchmark commands, one module each (``add_arguments`` and ``run``).

The benchmarks live beside the package, not in it: they measure keras_dl through its public API
and the hooks :mod:`keras_dl.data.hooks` names for them, and ``keras-dl bench`` is how a user
runs them (for example to size a node).
"""

from __future__ import annotations

from benchmarks import callbacks, distributed, fit, hosts, input, plan, predict, prune, tabular


def add_commands(sub, add_module_command, add_config_args) -> None:
    """Add each benchmark as a sub-command of ``keras-dl bench``."""
    for name, module in (
        ("input", input),
        ("fit", fit),
        ("distributed", distributed),
        ("hosts", hosts),
        ("callbacks", callbacks),
        ("predict", predict),
        ("plan", plan),
        ("prune", prune),
    ):
        add_module_command(sub, name, module)
    # It trains a recipe: the recipe's settings come as in `train` (--config, --set).
    add_module_command(sub, "tabular", tabular, lambda p, **_: add_config_args(p))
