"""Distributed training: step time for 1 process, 2 Horovod ranks and 2 mirrored devices.

Measured in one run on this host, on the same synthetic MLP and per-replica batch:

* step time and samples/s of one process (the baseline), of 2 Horovod processes (Gloo) and of
  ``MirroredStrategy`` over 2 logical CPU devices, with scaling efficiency
  (samples/s over replicas x baseline samples/s);
* the time of one grouped allreduce of the model's gradients, and of single buffers from
  64 KiB to 16 MiB, as bus bandwidth (2(n-1)/n x bytes / time);
* what that predicts for N workers: allreduce time >= 2(N-1)/N x gradient bytes / link bandwidth.

Each figure is printed (JSON) beside its baseline from the same run, as a ratio. Every
measurement runs in a fresh process, so that the TensorFlow thread pools of one do not slow
the next.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

# Links to project the allreduce bound onto, in bytes/s (one direction).
LINKS = {"10GbE": 1.25e9, "100GbE": 12.5e9, "NVLink3 (A100)": 300e9}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``keras-dl bench distributed``."""
    parser.add_argument("--width", type=int, default=1024, help="MLP hidden units (default 1024)")
    parser.add_argument("--batch", type=int, default=256, help="rows per replica (default 256)")
    parser.add_argument("--steps", type=int, default=40, help="timed steps (default 40)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps (default 5)")
    parser.add_argument(
        "--repeats", type=int, default=1, help="interleaved repeats, best kept (default 1)"
    )
    parser.add_argument(
        "--worker", choices=["single", "mirrored"], help=argparse.SUPPRESS
    )  # internal: one measurement in this process


def run(args) -> int:
    """Run every measurement and print the JSON report."""
    if getattr(args, "worker", None):
        print("RESULT " + json.dumps(_measure_fit(args, args.worker)), flush=True)
        return 0
    from keras_dl.launch import HorovodRunner

    load_before = round(os.getloadavg()[0], 2)  # other work on the host skews every figure
    options = {k: getattr(args, k) for k in ("width", "batch", "steps", "warmup")}
    runs: dict[str, list] = {"single": [], "mirrored": [], "horovod": []}
    # Interleaved repeats, keeping each mode's fastest: a load spike from other work on the
    # host then hits one repeat, not one mode.
    for _ in range(max(1, getattr(args, "repeats", 1))):
        runs["single"].append(_in_subprocess(args, "single"))
        runs["mirrored"].append(_in_subprocess(args, "mirrored"))
        runs["horovod"].append(HorovodRunner(np=-2).run(_horovod_rank, args=options))
    single = min(runs["single"], key=lambda r: r["step_ms"])
    mirrored = min(runs["mirrored"], key=lambda r: r["step_ms"])
    horovod = min(runs["horovod"], key=lambda r: r["fit"]["step_ms"])
    all_steps = {
        "single": [r["step_ms"] for r in runs["single"]],
        "horovod_2": [r["fit"]["step_ms"] for r in runs["horovod"]],
        "mirrored_2": [r["step_ms"] for r in runs["mirrored"]],
    }
    report = {
        "setup": {
            "host_cpus": os.cpu_count(),
            "load_average_1m_before_after": [load_before, round(os.getloadavg()[0], 2)],
            "model": f"MLP 64-{args.width}-{args.width}-10",
            "gradient_bytes": single["gradient_bytes"],
            "batch_per_replica": args.batch,
            "steps": args.steps,
            "step_ms_of_each_repeat": all_steps,
        },
        "single": single,
        "horovod_2": _versus(horovod["fit"], single, replicas=2),
        "mirrored_2": _versus(mirrored, single, replicas=2),
        "allreduce": _allreduce_report(horovod, single),
        "prediction": _predict(single, horovod),
    }
    print(json.dumps(report, indent=2))
    return 0


# -- measurements ------------------------------------------------------------------------------


def _build(width: int):
    import keras

    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    return model


def _dataset(batch: int):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * 8, 64)).astype("float32")
    y = rng.integers(0, 10, size=batch * 8).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).repeat()


def _measure_fit(args, mode: str, hvd=None) -> dict:
    """Steps of ``model.fit`` on in-memory data; the median step time after warmup."""
    import keras

    from keras_dl.callbacks import BroadcastState
    from keras_dl.distribute import horovod as khvd

    keras.utils.set_random_seed(0)
    replicas, callbacks = 1, []
    if mode == "mirrored":
        from keras_dl.distribute.strategy import make_strategy, use_logical_cpus

        use_logical_cpus(2)
        strategy = make_strategy("mirrored")
        replicas = strategy.num_replicas_in_sync
    else:
        import tensorflow as tf

        strategy = tf.distribute.get_strategy()
    with strategy.scope():
        model = _build(args["width"] if isinstance(args, dict) else args.width)
        opt = keras.optimizers.SGD(0.01)
        if hvd is not None:
            opt = khvd.distributed_optimizer(opt)
            callbacks.append(BroadcastState())
        model.compile(
            optimizer=opt,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=False,  # the same graph in all three modes (Horovod ops have no XLA)
        )
    a = args if isinstance(args, dict) else vars(args)
    timer = _step_timer()
    model.fit(
        _dataset(a["batch"] * replicas),
        epochs=1,
        steps_per_epoch=a["warmup"] + a["steps"],
        callbacks=[*callbacks, timer],
        verbose=0,
        shuffle=False,
    )
    step = sorted(timer.times[a["warmup"] :])[len(timer.times[a["warmup"] :]) // 2]
    grad_bytes = sum(int(v.numpy().nbytes) for v in model.trainable_variables)
    return {
        "step_ms": round(step * 1e3, 3),
        "samples_per_s": round(a["batch"] * replicas / step, 1),
        "replicas": replicas,
        "gradient_bytes": grad_bytes,
    }


def _horovod_rank(args: dict) -> dict:
    """On every Horovod rank: the fit measurement, then allreduce timings."""
    import keras

    from keras_dl.distribute import horovod as khvd

    hvd = khvd.init()
    out = {"fit": _measure_fit(args, "horovod", hvd=hvd)}
    out["fit"]["replicas"] = hvd.size()
    out["fit"]["samples_per_s"] = round(out["fit"]["samples_per_s"] * hvd.size(), 1)
    model = _build(args["width"])
    shapes = [tuple(v.shape) for v in model.trainable_variables]
    keras.backend.clear_session()
    out["model_allreduce_ms"] = _time_allreduce(hvd, shapes, args["steps"])
    out["buffers"] = [
        {"bytes": n * 4, "ms": _time_allreduce(hvd, [(n,)], args["steps"])}
        for n in (1 << 14, 1 << 18, 1 << 20, 1 << 22)
    ]
    out["size"] = hvd.size()
    return out


def _time_allreduce(hvd, shapes: list, steps: int) -> float:
    """Median ms of one grouped allreduce of float32 tensors of ``shapes`` inside a tf.function."""
    import tensorflow as tf

    tensors = [tf.random.normal(s) for s in shapes]

    @tf.function
    def reduce(ts):
        # Collective: the same grouped allreduce the distributed optimizer runs each step.
        return hvd.grouped_allreduce(ts, op=hvd.Average)

    times = []
    for i in range(steps + 3):
        start = time.perf_counter()
        out = reduce(tensors)
        _ = out[0].numpy()
        if i >= 3:
            times.append(time.perf_counter() - start)
    return round(sorted(times)[len(times) // 2] * 1e3, 3)


# -- report ------------------------------------------------------------------------------------


def _versus(measured: dict, baseline: dict, replicas: int) -> dict:
    speedup = measured["samples_per_s"] / baseline["samples_per_s"]
    return {
        **measured,
        "baseline_step_ms": baseline["step_ms"],
        "step_time_ratio": round(measured["step_ms"] / baseline["step_ms"], 3),
        "baseline_samples_per_s": baseline["samples_per_s"],
        "throughput_ratio": round(speedup, 3),
        "scaling_efficiency": round(speedup / replicas, 3),
    }


def _allreduce_report(horovod: dict, single: dict) -> dict:
    n, grad_bytes = horovod["size"], single["gradient_bytes"]
    factor = 2 * (n - 1) / n
    ms = horovod["model_allreduce_ms"]
    return {
        "gradient_bytes": grad_bytes,
        "per_step_ms": ms,
        "baseline_single_step_ms": single["step_ms"],
        "share_of_single_step": round(ms / single["step_ms"], 3),
        "bus_bandwidth_GBps": round(factor * grad_bytes / (ms / 1e3) / 1e9, 3),
        "buffers": [
            {
                **b,
                "bus_bandwidth_GBps": round(factor * b["bytes"] / (b["ms"] / 1e3) / 1e9, 3),
                "ms_per_MiB": round(b["ms"] / (b["bytes"] / 2**20), 3),
            }
            for b in horovod["buffers"]
        ],
    }


def _predict(single: dict, horovod: dict) -> dict:
    """Allreduce lower bound per step for N workers, beside the measured compute step.

    ``2(N-1)/N x gradient bytes / link bandwidth`` (ring allreduce); the efficiency bound
    assumes no overlap of compute and communication (Horovod overlaps some).
    """
    grad_bytes, compute_ms = single["gradient_bytes"], single["step_ms"]
    best = max(b["bytes"] / (b["ms"] / 1e3) for b in horovod["buffers"])
    links = {"this host loopback (measured, 2 ranks)": best, **LINKS}
    out: dict = {"compute_step_ms": compute_ms, "gradient_bytes": grad_bytes}
    for link, bw in links.items():
        bound = {n: 2 * (n - 1) / n * grad_bytes / bw * 1e3 for n in (2, 4, 8, 16, 64)}
        out[link] = {
            "link_GBps": round(bw / 1e9, 3),
            "allreduce_bound_ms": {n: round(ms, 3) for n, ms in bound.items()},
            "efficiency_bound": {
                n: round(compute_ms / (compute_ms + ms), 3) for n, ms in bound.items()
            },
        }
    return out


def _in_subprocess(args, mode: str) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.distributed", "--worker", mode]
    cmd += ["--width", str(args.width), "--batch", str(args.batch)]
    cmd += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"bench worker {mode!r} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def _step_timer():
    """A minimal Keras callback recording the wall time of each training batch."""
    import keras

    class StepTimer(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.times = []

        def on_train_batch_begin(self, batch, logs=None):
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter() - self._start)

    return StepTimer()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))
