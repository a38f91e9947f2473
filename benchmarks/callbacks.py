"""Callbacks: per-epoch overhead of the default callback set against no callbacks (digits).

Trains the digits recipe on its Delta table (the real data path) in one process, alternating
one-epoch fits without callbacks (the baseline, ``verbose=0``) and with the default set of
``keras_dl.train`` (checkpoint each epoch, early stopping with the NaN guard, throughput with
instrumented input, MLflowLogger on a SQLite store, plots), and a third case: that set plus
the system-metrics sampler (``SystemMetrics``, every ``--system-metrics-seconds``), whose
baseline is the set without it. Epochs are made long (default
>= 10 s) by running many steps over the repeating training data. Epoch times are taken by a
timer that only has epoch hooks, so it does not change how Keras dispatches batch callbacks.

Prints JSON: each figure beside its baseline, as a ratio, plus the cost of one checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``keras-dl bench callbacks``."""
    parser.add_argument("--table", help="digits Delta table (default: ingest one into a temp dir)")
    parser.add_argument(
        "--epoch-seconds", type=float, default=20.0, help="target epoch length (default 20)"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="baseline/callbacks epoch pairs (default 5)"
    )
    parser.add_argument("--batch", type=int, default=32, help="batch size (default 32)")
    parser.add_argument(
        "--system-metrics-seconds",
        type=float,
        default=10.0,
        help="sampling interval of the system-metrics case (default 10, as in training)",
    )


def run(args) -> int:
    """Run the measurement and print the JSON report."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.TemporaryDirectory(prefix="keras_dl_bench_callbacks_") as tmp:
        print(json.dumps(measure(args, tmp), indent=2))
    return 0


def measure(args, tmp: str) -> dict:
    """Alternate baseline and default-callback fits; return the report."""
    import keras

    from keras_dl.callbacks import SystemMetrics
    from keras_dl.checkpoints import Checkpoints
    from keras_dl.config import resolve
    from keras_dl.data.splits import make_splits
    from keras_dl.recipe import load_recipe
    from keras_dl.run import make_callbacks, open_run, prepare_fit
    from keras_dl.train import make_optimizer

    table = args.table or _ingest(tmp)
    recipe = load_recipe("digits")
    exp = resolve(
        recipe.defaults,
        sets=[
            f"data.table={table}",
            f"train.batch_size={args.batch}",
            "train.verbose=0",
            "train.lr_schedule=constant",
            f"runtime.run_dir={tmp}/run",
            "runtime.resume=false",
            "callbacks.monitor=loss",  # the timed fits have no validation data
            f"tracking.uri=sqlite:///{tmp}/mlflow.db",
            "tracking.system_metrics_seconds=0",  # the sampler is the third case's addition
        ],
    )
    keras.utils.set_random_seed(exp.train.seed)
    data = make_splits(exp.data, args.batch, accept=recipe.accept, preprocess=recipe.preprocess)
    model = recipe.build_model(data, exp)
    model.compile(make_optimizer("adam", 1e-3), loss=recipe.loss, metrics=list(recipe.metrics))
    base_ds = data.train.dataset

    # Warm up (tracing, reader threads), then size the epochs from the measured step time.
    timer = _epoch_timer()
    model.fit(base_ds, epochs=1, steps_per_epoch=50, verbose=0, shuffle=False, callbacks=[timer])
    model.fit(base_ds, epochs=1, steps_per_epoch=500, verbose=0, shuffle=False, callbacks=[timer])
    # Sized with margin: a loaded host can make the measured epochs faster than this probe.
    steps = max(100, round(args.epoch_seconds / (timer.seconds[-1] / 500)))

    with open_run(exp) as run:  # the run_dir lock, the MLflow run; ends FINISHED
        run.start(tags={"bench": "callbacks"})
        run_callbacks = make_callbacks(run, data)
        prepare_fit(run_callbacks, model, data)  # instruments data.train.dataset for Throughput
        cb_ds = data.train.dataset
        callbacks = run_callbacks.ordered()
        system = SystemMetrics(run_callbacks.logger, args.system_metrics_seconds)
        # Before the logger, where make_callbacks puts it when tracking.system_metrics_seconds > 0.
        with_system = dataclasses.replace(run_callbacks, system_metrics=system).ordered()
        model.fit(
            cb_ds, epochs=1, steps_per_epoch=50, verbose=0, shuffle=False, callbacks=callbacks
        )  # warm-up
        # One-epoch fits, alternating: each pair runs close in time, under the same load
        # from whatever else shares the machine.
        cases = (
            ("baseline", base_ds, []),
            ("callbacks", cb_ds, callbacks),
            ("system_metrics", cb_ds, with_system),
        )
        times: dict[str, list[float]] = {name: [] for name, _, _ in cases}
        cpu: dict[str, list[float]] = {name: [] for name, _, _ in cases}
        load_before = os.getloadavg()[0]
        for r in range(args.rounds):
            # Reversed every other round: no case always runs right after the same one.
            for name, ds, cbs in cases if r % 2 == 0 else cases[::-1]:
                timer = _epoch_timer()
                model.fit(
                    ds,
                    epochs=1,
                    steps_per_epoch=steps,
                    verbose=0,
                    shuffle=False,
                    callbacks=[*cbs, timer],
                )
                times[name] += timer.seconds
                cpu[name] += timer.cpu_seconds
        sample_ms = _sample_cpu_ms(exp.tracking.uri, run.run_id)
        saves, probe = [], Checkpoints(f"{tmp}/probe", keep=5)
        for i in range(5):
            t0 = time.perf_counter()
            probe.save(i, model, {"probe": i})
            saves.append(time.perf_counter() - t0)

    base, with_cb = statistics.median(times["baseline"]), statistics.median(times["callbacks"])
    overhead = 100 * (with_cb / base - 1)
    paired = statistics.median(c / b for b, c in zip(times["baseline"], times["callbacks"]))
    cpu_base, cpu_cb = statistics.median(cpu["baseline"]), statistics.median(cpu["callbacks"])
    return {
        "setup": {
            "recipe": "digits",
            "host_cpus": os.cpu_count(),
            "batch_size": args.batch,
            "steps_per_epoch": steps,
            "epochs_measured_each": args.rounds,
            "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "callbacks": [type(c).__name__ for c in callbacks],
        },
        "epoch_seconds": _pair(base, with_cb),
        "step_time_ms": _pair(1000 * base / steps, 1000 * with_cb / steps),
        "samples_per_sec": _pair(steps * args.batch / base, steps * args.batch / with_cb),
        # This process's CPU time (all its threads): what the callbacks cost, whatever the
        # machine's other load does to wall time.
        "cpu_seconds_per_epoch": _pair(cpu_base, cpu_cb),
        "overhead_percent": round(overhead, 2),
        "paired_overhead_percent": round(100 * (paired - 1), 2),
        "cpu_overhead_percent": round(100 * (cpu_cb / cpu_base - 1), 2),
        "target_percent": 3.0,
        "meets_target": overhead <= 3.0,  # on the wall-time medians
        "shortest_epoch_seconds": round(min(times["baseline"] + times["callbacks"]), 2),
        "checkpoint_save_ms": round(1000 * statistics.median(saves), 1),
        "system_metrics": _system_case(times, cpu, args.system_metrics_seconds, sample_ms),
        "epoch_seconds_all": {k: [round(v, 3) for v in vs] for k, vs in times.items()},
    }


def _system_case(times: dict, cpu: dict, seconds: float, sample_ms: float) -> dict:
    """The sampler's case against its baseline, the default set without it."""
    base, value = statistics.median(times["callbacks"]), statistics.median(times["system_metrics"])
    paired = statistics.median(
        s / c for c, s in zip(times["callbacks"], times["system_metrics"], strict=True)
    )
    cpu_base, cpu_value = (
        statistics.median(cpu["callbacks"]),
        statistics.median(cpu["system_metrics"]),
    )
    return {
        "every_seconds": seconds,
        "baseline": "callbacks",
        "epoch_seconds": _pair(base, value),
        "cpu_seconds_per_epoch": _pair(cpu_base, cpu_value),
        "overhead_percent": round(100 * (value / base - 1), 2),
        "paired_overhead_percent": round(100 * (paired - 1), 2),
        "cpu_overhead_percent": round(100 * (cpu_value / cpu_base - 1), 2),
        # What one sample costs in CPU, read and sent to the run, as a share of one core over
        # the interval between samples: what the epoch figures above cannot resolve on a
        # loaded host.
        "sample_and_send_cpu_ms": round(sample_ms, 3),
        "sample_and_send_share_percent": round(100 * sample_ms / (1000 * seconds), 4),
        "target_percent": 1.0,
        "meets_target": value / base - 1 <= 0.01,
    }


def _sample_cpu_ms(uri: str, run_id: str, samples: int = 50) -> float:
    """Median CPU time of one sample read (psutil, and NVML where it answers) and logged to
    the run in one call, as the logger's sending thread does (a SQLite write, mostly)."""
    import mlflow
    from mlflow.entities import Metric

    from keras_dl.callbacks import SystemSampler

    client = mlflow.MlflowClient(uri)
    sampler = SystemSampler(3600)
    sampler.start()
    try:
        times = []
        for step in range(samples):
            t0 = time.process_time()
            stamp = int(time.time() * 1000)
            values = sampler.sample()
            metrics = [Metric(f"bench/system/{k}", v, stamp, step) for k, v in values.items()]
            client.log_batch(run_id, metrics=metrics)
            times.append(time.process_time() - t0)
    finally:
        sampler.stop()
    return 1000 * statistics.median(times)


def _epoch_timer():
    """A callback that records each epoch's wall time, from epoch hooks only (so Keras keeps
    dispatching batch callbacks as it would without it)."""
    import keras

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds: list[float] = []

            self.cpu_seconds: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            self._t0, self._c0 = time.perf_counter(), time.process_time()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self._t0)
            self.cpu_seconds.append(time.process_time() - self._c0)

    return EpochTimer()


def _pair(baseline: float, value: float) -> dict:
    return {
        "baseline": round(baseline, 4),
        "value": round(value, 4),
        "ratio": round(value / baseline, 4),
    }


def _ingest(tmp: str) -> str:
    from keras_dl.data.ingest import ingest_sklearn_digits

    path = f"{tmp}/digits"
    ingest_sklearn_digits(path)
    return path
