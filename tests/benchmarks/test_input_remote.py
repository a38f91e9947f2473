"""`keras-dl bench input --store s3|azure --latency-ms D`: moto's S3 or Azurite behind a loopback
latency proxy."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from benchmarks import input_remote
from benchmarks.latency_proxy import LatencyProxy
from tests.conftest import run_cli


@pytest.fixture
def echo_port():
    """A real TCP server on loopback that sends back whatever it receives."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(1 << 16):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()


def _round_trip(port: int, payload: bytes) -> tuple[bytes, float]:
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += s.recv(1 << 16)
    return got, time.monotonic() - start


def test_the_proxy_holds_each_request_chunk_for_the_delay_and_counts_the_bytes(echo_port):
    payload = b"GET /bench/t HTTP/1.1\r\n" + b"x" * 977
    with LatencyProxy(echo_port, delay_ms=300) as proxy:
        assert proxy.url.startswith("http://127.0.0.1:")
        got, seconds = _round_trip(proxy.port, payload)
        assert got == payload and seconds >= 0.3  # held on the way to the server
        proxy.delay_ms = 0  # the next chunk goes straight on
        assert proxy.delay_ms == 0
        got, _ = _round_trip(proxy.port, payload)
        assert got == payload
        time.sleep(0.2)  # the proxy's threads count after forwarding
        assert proxy.counts() == {
            "sent": 2000,
            "received": 2000,
            "requests": 2,
            "connections": 2,
        }


def _check_tables(report: dict, stderr: str, rows: dict[str, int]) -> None:
    """Every path, ratio, byte count and target of each table in ``rows`` (its rows), at 0 and
    20 ms."""
    assert set(report["tables"]) == set(rows) == set(report["config"]["tables"])
    paths = {
        f"{p}@{ms}ms" for p in ("keras_dl", "keras_dl_io_off", "pyarrow_scan") for ms in (0, 20)
    } | {"keras_dl_disk_cache", "keras_dl_local_disk"}  # epoch 2 from data.cache_dir, baseline
    ratios = {
        "keras_dl@20ms/keras_dl@0ms",
        "keras_dl@20ms/pyarrow_scan@20ms",
        "keras_dl@20ms/keras_dl_io_off@20ms",
        "keras_dl@0ms/keras_dl_io_off@0ms",
        "keras_dl_io_off@20ms/keras_dl_io_off@0ms",
        "pyarrow_scan@20ms/pyarrow_scan@0ms",
        "keras_dl_disk_cache/keras_dl_local_disk",
    }
    targets = {(t["table"], t["ratio"]): t for t in report["targets"]}
    assert set(targets) == {
        (table, ratio)
        for table in rows
        for ratio in (
            "keras_dl@20ms/keras_dl@0ms",
            "keras_dl@20ms/pyarrow_scan@20ms",
            "keras_dl_disk_cache/keras_dl_local_disk",
            "keras_dl bytes fetched/planned",
        )
    }
    assert all(isinstance(t["met"], bool) for t in targets.values())
    for table, count in rows.items():
        figures = report["tables"][table]
        assert set(figures["rows_per_s"]) == paths and set(figures["spread"]) == paths
        assert all(figures["rows_per_s"][p] > 0 for p in paths)
        assert set(figures["cpu_us_per_unit"]) == paths
        assert set(figures["ratios"]) == ratios == set(figures["ratio_spread"])
        counted = figures["bytes"]
        assert counted["planned"] > 0
        for path in ("keras_dl", "keras_dl_io_off", "pyarrow_scan"):
            assert counted[path]["rows"] == count  # one whole epoch, counted at the proxy
            assert counted[path]["fetched"] >= counted["planned"]  # planned chunks, and headers
            assert counted[path]["requests"] > 0
        # Epoch 2 from data.cache_dir: every row, and nothing asked of the store.
        assert counted["keras_dl_disk_cache"]["rows"] == count
        assert counted["keras_dl_disk_cache"]["fetched"] == 0
        # Fetched ahead, each file is opened once, not once per row group.
        assert counted["keras_dl"]["requests"] <= counted["keras_dl_io_off"]["requests"]
        assert targets[(table, "keras_dl_disk_cache/keras_dl_local_disk")]["cpu_ratio"] > 0
        assert f"{table:8s} {'':>5s}  keras_dl@20ms/keras_dl@0ms" in stderr  # the targets' table


@pytest.mark.slow
def test_the_quick_s3_bench_reports_every_path_at_both_latencies(tmp_path):
    out = tmp_path / "remote.json"
    done = run_cli(
        "bench", "input", "--store", "s3", "--latency-ms", "20", "--quick", "--tables", "floats40",
        "--out", str(out), timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    config = report["config"]
    assert config["latency_ms"] == [0.0, 20.0] and config["mode"] == "quick"
    assert config["store"].startswith("s3 ")
    assert config["tables"]["floats40"]["rows"] == 24_000
    assert config["tables"]["floats40"]["files"] == 4
    _check_tables(report, done.stderr, {"floats40": 24_000})


@pytest.mark.slow
def test_the_quick_azure_bench_reports_every_path_of_both_tables(tmp_path):
    out = tmp_path / "remote.json"
    done = run_cli(
        "bench", "input", "--store", "azure", "--latency-ms", "20", "--quick", "--out", str(out),
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["config"]["store"].startswith("azure ")  # Azurite, at abfss://
    _check_tables(report, done.stderr, {"floats40": 24_000, "wide": 1_024})


def test_the_remote_bench_names_the_tables_it_knows():
    assert input_remote._tables(None) == ("floats40", "wide")
    assert input_remote._tables("wide") == ("wide",)
    with pytest.raises(SystemExit, match=r"--tables 'narrow'.* are floats40, wide .* not narrow"):
        input_remote._tables("narrow")
