"""tests/machine_probe.py: the lines a whole run ends with, saying what its machine was like."""

import re

from tests import machine_probe


def test_the_summary_gives_the_host_the_run_s_cpu_and_a_probe_at_each_end(monkeypatch):
    monkeypatch.setattr(machine_probe, "_START", {})
    assert machine_probe.summary() == []  # no start, nothing to say
    machine_probe.start()
    before = machine_probe._START["counters"]
    assert {"user", "system", "idle", "steal", "pgfault", "ctxt", "processes"} <= set(before)
    host, run, *probes = machine_probe.summary()
    assert host.startswith("host: ") and "CPUs" in host
    assert re.match(r"run: \d+ s; cores busy: user [\d.]+, system [\d.]+, iowait", run)
    assert "steal" in run and "processes started" in run
    assert [p.split(":")[0] for p in probes] == ["probe at the start", "probe at the end"]
    for line in probes:
        figures = [float(x) for x in re.findall(r"(\d+(?:\.\d+)?) (?:ms|us)", line)]
        assert len(figures) == 6 and all(f > 0 for f in figures), line
