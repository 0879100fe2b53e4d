"""The plan table's NIC figures agree with each other and with the bottleneck they sit beside."""

from __future__ import annotations

import json
import re
from pathlib import Path

from akosim.cli import main
from akosim.planning.result_tables import NIC_HEADER


def test_one_server_ps_row_shows_the_busy_server_nic_the_bottleneck_names(
        tmp_path: Path, capsys) -> None:
    """The comparison table is the same whatever ranks its rows (akosim.cli prints it
    before any ranking): ranked by throughput, the plan trains nothing to print it."""
    out = tmp_path / "plan.json"
    assert main(["--workers", "16", "--bandwidth", "100mbps", "--compute", "100ms",
                 "--gradient-size", "4MB", "--rounds", "6", "--rank-by", "throughput",
                 "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert NIC_HEADER in table
    runs = {run["label"]: run for run in json.loads(out.read_text())["runs"]}
    rows = [line for line in table.splitlines() if re.search(r"\d+% / \d+%", line)]
    assert rows
    for line in rows:
        label = next(name for name in runs if line.startswith(name))
        run = runs[label]
        workers, busiest = map(int, re.search(r"(\d+)% / (\d+)%", line).groups())
        uplinks = [w["uplink_utilisation"] for w in run["per_worker"]]
        assert workers == round(100 * sum(uplinks) / len(uplinks))  # the training workers'
        assert busiest == round(100 * max(run["max_uplink_utilisation"],
                                          run["max_downlink_utilisation"]))
        named = int(re.search(r"(\d+)% busy", line).group(1))
        if re.search(r"\b(uplink|downlink) of", line):  # a NIC is the bottleneck
            assert busiest == named, line
    one_server = next(line for line in rows if line.startswith("ps 1 server"))
    workers, busiest = map(int, re.search(r"(\d+)% / (\d+)%", one_server).groups())
    assert workers < busiest  # the workers idle while the one server's NIC is busy
