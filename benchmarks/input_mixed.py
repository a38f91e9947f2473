"""The mixed case of ``keras-dl bench input``: two tables mixed by weight (``data.sources``,
half each) beside each table alone, through the same training split ``fit`` gets
(``make_splits``), interleaved in the same rounds.

The target (``benchmarks.input.MIXED_TARGETS``): a mixed epoch streams within 0.9x of the
slower table alone (``mixed/slower_table``: of the medians; its spread, per round against that
round's slower table). Both tables are the narrow table's shape, each of ``rows`` rows, so the
mixed epoch is ``2 * rows`` rows. All three stream (``data.cache=never``) unless ``cache`` is
``"auto"``: then all three are served from memory after their first read (the mixed split per
source, :mod:`keras_dl.data.stream.mix_cache`), the comparison of the cached paths.
"""

from __future__ import annotations


def measure_mixed(
    work: str,
    rows: int,
    rows_per_group: int,
    batches: list[int],
    rounds: int,
    cache: str = "never",
):
    """Rows/s of the mixed split and of each table alone, per batch size, with CPU per row."""
    from benchmarks import input_tables as tables
    from benchmarks import timing
    from benchmarks.input_paths import consume_split
    from keras_dl.config import DataConfig, SourceConfig

    a = tables.write_narrow(f"{work}/mixed_a", rows, rows_per_group, seed=1)
    b = tables.write_narrow(f"{work}/mixed_b", rows, rows_per_group, seed=2)
    common = {
        "label": "i",
        "features": ("f", "v"),
        "validation_split": "",
        "test_split": "",
        "cache": cache,
    }
    configs = {
        "mixed": DataConfig(
            sources=(SourceConfig("a", a, 1.0), SourceConfig("b", b, 1.0)), **common
        ),
        "table_a": DataConfig(table=a, **common),
        "table_b": DataConfig(table=b, **common),
    }
    out: dict = {"rows": {"table_a": rows, "table_b": rows, "mixed": 2 * rows}, "batches": {}}
    for batch in batches:
        splits = {name: _train_split(data, batch) for name, data in configs.items()}
        paths = {name: (lambda s=s, b=batch: consume_split(s, b)) for name, s in splits.items()}
        cpu: dict = {}
        samples = timing.measure_rounds(rounds, paths, cpu)
        figures = timing.summarize(samples, subjects=("mixed",), cpu=cpu)
        slower = [min(x, y) for x, y in zip(samples["table_a"], samples["table_b"])]
        medians = figures["rows_per_s"]
        figures["ratios"]["mixed/slower_table"] = timing.ratio(
            medians["mixed"], min(medians["table_a"], medians["table_b"])
        )
        figures["ratio_spread"]["mixed/slower_table"] = timing.ratio_spread(
            samples["mixed"], slower
        )
        out["batches"][str(batch)] = figures
    return out


def _train_split(data, batch: int):
    from keras_dl.data import make_splits

    return make_splits(data, batch).train
