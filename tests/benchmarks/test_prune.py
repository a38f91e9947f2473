"""`keras-dl bench prune`: a selective filter read with and without data skipping."""

import argparse
import json

from benchmarks import prune


def test_prune_bench_reports_each_figure_beside_its_baseline(tmp_path, capsys):
    out = tmp_path / "prune.json"
    parser = argparse.ArgumentParser()
    prune.add_arguments(parser)
    args = parser.parse_args(
        ["--files", "6", "--rows", "50", "--features", "2", "--keep", "3", "--repeats", "1"]
    )
    args.out = str(out)
    assert prune.run(args) == 0
    report = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == report
    assert report["same_rows"] and report["rows_kept"] == 150
    figures = report["figures"]
    # Days 21-23 live in the last file: 5 of 6 files skipped by the log, 1 of its 4 row groups
    # by its footer; the baseline opens every file and scans every row group's filter column.
    assert figures["files_opened"] == {"skipping": 1, "baseline": 6, "ratio": round(1 / 6, 4)}
    assert figures["row_groups_scanned"] == {"skipping": 3, "baseline": 24, "ratio": 0.125}
    assert figures["row_groups_read"]["skipping"] == figures["row_groups_read"]["baseline"] == 3
    assert report["files_skipped"] == 5
    assert set(figures) >= {"bytes_read", "wall_s", "cpu_s", "cpu_us_per_kept_row"}
