"""Build hook: ship ``keras_dl_petastorm_compat.pth`` into site-packages with the package.

Everything else is declared in setup.cfg. The .pth file makes every Python process of the
environment (Petastorm's process-pool workers, Spark's Python workers, Horovod ranks) register
the import hooks at start-up: the Petastorm one before anything imports Petastorm (on pyarrow
>= 16 ``import petastorm`` fails without it), and the one that defers Keras' scikit-learn and
matplotlib extras to their first use (opt-in: only with ``KERAS_DL_DEFER_KERAS_EXTRAS=1`` in the
environment; otherwise Keras imports as it ships). The hooks are the top-level modules
keras_dl_petastorm_hook and keras_dl_keras_hook (setup.cfg ``py_modules``): the .pth file imports
them and not keras_dl, and each does nothing until Petastorm or Keras is imported.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "keras_dl_petastorm_compat.pth"


class BuildPyWithPth(build_py):
    """Copy the .pth file to the root of the build (site-packages once installed)."""

    def run(self):
        super().run()
        self.copy_file(str(Path(__file__).parent / PTH), str(Path(self.build_lib) / PTH))

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})
