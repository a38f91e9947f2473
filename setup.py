"""Build hook: ship ``keras_dl_petastorm_compat.pth`` into site-packages with the package.

Everything else is declared in setup.cfg. The .pth file makes every Python process of the
environment (Petastorm's process-pool workers, Spark's Python workers, Horovod ranks) register
the Petastorm import hook at start-up, before anything imports Petastorm: on pyarrow >= 16
``import petastorm`` fails without it. The hook is the top-level module keras_dl_petastorm_hook
(setup.cfg ``py_modules``): the .pth file imports it and not keras_dl, and it does nothing until
Petastorm is imported.
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
