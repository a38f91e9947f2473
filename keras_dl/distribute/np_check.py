"""Refuse a local ``runtime.np`` this host cannot run, before any rank starts.

``runtime.np=-99`` on a 2-core host would start 99 Horovod processes, each importing TensorFlow,
until the kernel's OOM killer or the launcher's timeout ends them with SIGKILLs and SIGTERMs. So
before the local launcher starts anything, :func:`check_local_np` compares ``-np`` with:

* this host's memory: ``MemAvailable`` in ``/proc/meminfo`` against ``-np`` times a rank's
  measured footprint (:func:`measure_rank_footprint`);
* its GPUs, when TensorFlow uses GPUs here: one rank per GPU (ranks pin GPU ``local_rank``);
* its cores: more ranks than cores is allowed (the ranks share them, the suite does it), and
  said in one log line.

The Spark side (``np > 0``: tasks against the cluster's slots) is
:func:`keras_dl.distribute.slots.wait_for_free_slots`.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from keras_dl.errors import DistributedError

log = logging.getLogger(__name__)

# What a rank of a keras_dl job imports before it trains (keras_dl.launch.job.train_rank).
RANK_MODULES = ("tensorflow", "keras", "keras_dl.train")
_GIB = 1024**3
_said: set[tuple[int, int]] = set()  # (ranks, cores) already logged as oversubscribed


def check_local_np(np: int, cache: Path | None = None) -> None:
    """Refuse ``np < 0`` ranks this host cannot hold; log once when they share its cores.

    Does nothing for ``np >= 0``. Measures a rank's footprint once per environment (cached in
    ``cache``; a few seconds, a fresh interpreter importing TensorFlow).

    Args:
        np: ``runtime.np``.
        cache: The footprint cache file. Defaults to :func:`default_cache`.

    Raises:
        DistributedError: When ``-np`` ranks need more memory than the host has available, or
            more GPUs than TensorFlow sees here (when it sees any); naming ``runtime.np``, the
            figures and the fix.
    """
    if np >= 0:
        return
    refuse_local_np(
        -np,
        footprint=measure_rank_footprint(cache),
        available=read_available_memory(),
        gpus=count_local_gpus(),
        cores=len(os.sched_getaffinity(0)),
    )


def refuse_local_np(ranks: int, *, footprint: int, available: int, gpus: int, cores: int) -> None:
    """The rule :func:`check_local_np` applies to the host's figures (bytes, counts).

    Raises:
        DistributedError: When ``ranks * footprint > available``, or ``0 < gpus < ranks``.
    """
    need = ranks * footprint
    if need > available:
        fit = max(available // footprint, 0)
        use = f"at most {fit} local ranks (runtime.np=-{fit})" if fit else "no local ranks"
        raise DistributedError(
            f"runtime.np=-{ranks} starts {ranks} Horovod ranks on this host, each needing at "
            f"least {_gib(footprint)} (the measured resident memory of a Python process that "
            f"imports {', '.join(RANK_MODULES)}), {_gib(need)} in all, but this host has "
            f"{_gib(available)} available (MemAvailable in /proc/meminfo): the ranks would be "
            f"killed. Use {use}, free memory, or run "
            "runtime.np=N Spark tasks on a cluster."
        )
    if 0 < gpus < ranks:
        raise DistributedError(
            f"runtime.np=-{ranks} starts {ranks} Horovod ranks on this host, one per GPU, but "
            f"TensorFlow sees {gpus} GPU(s) here (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}): ranks would share a GPU's "
            f"memory. Use runtime.np=-{gpus}, or runtime.np=N Spark tasks on more GPUs."
        )
    if ranks > cores and (ranks, cores) not in _said:
        _said.add((ranks, cores))
        log.warning(
            "runtime.np=-%d runs %d Horovod ranks on this host's %d core(s): they share the "
            "cores (allowed, each rank runs slower than on a core of its own).",
            ranks,
            ranks,
            cores,
        )


def measure_rank_footprint(cache: Path | None = None, modules: tuple = RANK_MODULES) -> int:
    """Bytes of resident memory a rank needs at least: a fresh interpreter's peak after imports.

    A child process of this Python (``sys.executable``, with this keras_dl on its path) imports
    ``modules`` (what a rank imports before it trains) and reports its peak resident set
    (``VmHWM``). A training rank holds more (its model, batches, tf.data's buffers), so this is a
    lower bound: a job refused on it can never fit, and none is refused that could. The figure is
    cached per environment (interpreter, module versions, keras_dl's folder) in ``cache``;
    a cache that cannot be written is skipped.

    Args:
        cache: The cache file. Defaults to :func:`default_cache`.
        modules: What the child imports. Defaults to :data:`RANK_MODULES`.
    """
    cache = cache or default_cache()
    key = _environment_key(modules)
    cached = _read_cache(cache).get(key)
    if cached is not None:
        return int(cached["bytes"])
    footprint = _measure(modules)
    _write_cache(cache, key, {"bytes": footprint, "modules": list(modules)})
    return footprint


def read_available_memory() -> int:
    """Bytes of memory the kernel can give new processes without swapping (``MemAvailable``)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise DistributedError("/proc/meminfo has no MemAvailable line (Linux 3.14 or later needed).")


def count_local_gpus() -> int:
    """GPUs TensorFlow uses in this environment; 0 when it is built without CUDA (tensorflow-cpu)."""
    import tensorflow as tf

    if not tf.test.is_built_with_cuda():
        return 0
    return len(tf.config.list_physical_devices("GPU"))


def default_cache() -> Path:
    """``$XDG_CACHE_HOME/keras-dl/rank-footprint.json`` (``~/.cache`` when it is unset)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root, "keras-dl", "rank-footprint.json")


# -- private helpers ---------------------------------------------------------------------------


_CHILD = """
import sys
for name in sys.argv[1:]:
    __import__(name)
with open("/proc/self/status") as f:
    print(next(line.split()[1] for line in f if line.startswith("VmHWM:")))
"""


def _measure(modules: tuple) -> int:
    here = str(Path(__file__).resolve().parents[2])  # this keras_dl, not another install's
    old = os.environ.get("PYTHONPATH", "")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([here, *([old] if old else [])]),
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, *modules],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise DistributedError(
            f"Measuring a Horovod rank's memory ({sys.executable} importing "
            f"{', '.join(modules)}) failed with exit {proc.returncode}: "
            f"{proc.stderr.strip()[-2000:]}"
        )
    return int(proc.stdout.split()[-1]) * 1024


def _environment_key(modules: tuple) -> str:
    from importlib import metadata

    # The distributions that provide the modules (tensorflow's is tensorflow-cpu here).
    provided = metadata.packages_distributions()
    versions = []
    for name in sorted({m.split(".")[0] for m in modules}):
        for dist in sorted(set(provided.get(name, [name]))):
            try:
                versions.append(f"{dist}=={metadata.version(dist)}")
            except metadata.PackageNotFoundError:
                versions.append(f"{dist}==?")
    here = str(Path(__file__).resolve().parents[1])
    return " ".join([sys.executable, sys.version.split()[0], here, *versions, *modules])


def _read_cache(cache: Path) -> dict:
    try:
        return json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(cache: Path, key: str, record: dict) -> None:
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        records = {**_read_cache(cache), key: record}
        tmp = cache.with_name(f"{cache.name}.{os.getpid()}")
        tmp.write_text(json.dumps(records, indent=1))
        os.replace(tmp, cache)  # atomic: two drivers measuring at once both leave a whole file
    except OSError as exc:
        log.debug("Not caching the rank footprint in %s: %s", cache, exc)


def _gib(n: int) -> str:
    return f"{n / _GIB:.2f} GiB"
