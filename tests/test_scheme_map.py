"""analysis.scheme_map: the quick grid's record shape, and the winner rule (the highest
samples/s among configurations whose staleness bound is within the limit)."""

from __future__ import annotations

import json

import pytest

from analysis import scheme_map as sm


def _row(scheme: str, samples_per_s: float, bound: float) -> sm.ConfigRow:
    return sm.ConfigRow(scheme=scheme, codec="none", label=scheme, samples_per_s=samples_per_s,
                        staleness_bound_rounds=bound, bytes_sent_per_worker_per_round=1.0,
                        round_time_s=1.0, eligible=bound <= sm.MAX_STALENESS_ROUNDS)


def test_winner_skips_too_stale_configurations() -> None:
    rows = [_row("ako p=auto", 900.0, 300.0), _row("allreduce", 50.0, 0.0),
            _row("diloco H=10", 80.0, 9.0)]
    winner, runner_up = sm.pick_winner(rows)
    assert winner is not None and winner.scheme == "diloco H=10"
    assert runner_up is not None and runner_up.scheme == "allreduce"
    assert sm.pick_winner([_row("ako p=auto", 900.0, 65.0)]) == (None, None)


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    out = tmp_path_factory.mktemp("scheme_map")
    assert sm.main(["--out", str(out), "--quick"]) == 0
    record = json.loads((out / "scheme_map.json").read_text(encoding="utf-8"))
    page = (out / "scheme-map.md").read_text(encoding="utf-8")
    assert (out / "scheme-map.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return record, {"page": page}


def test_quick_record_shape(quick: tuple[dict, dict]) -> None:
    record, _ = quick
    assert record["bandwidths"] == list(sm.QUICK_BANDWIDTHS)
    assert record["latencies"] == list(sm.QUICK_LATENCIES)
    cells = sm.cells_by_key(record)
    assert set(cells) == {(b, lat) for b in sm.QUICK_BANDWIDTHS for lat in sm.QUICK_LATENCIES}
    expected = {(name, codec) for name, codec, _ in sm.configurations(sm.QUICK_SCHEMES)}
    for cell in cells.values():
        assert {(r["scheme"], r["codec"]) for r in cell["rows"]} == expected
        for row in cell["rows"]:
            assert row["samples_per_s"] > 0
            assert row["bytes_sent_per_worker_per_round"] > 0
            assert row["eligible"] == (row["staleness_bound_rounds"]
                                       <= record["max_staleness_rounds"])


def test_quick_winners_follow_the_rule(quick: tuple[dict, dict]) -> None:
    record, texts = quick
    for cell in record["cells"]:
        eligible = [r for r in cell["rows"] if r["eligible"]]
        best = max(eligible, key=lambda r: r["samples_per_s"])
        assert cell["winner_samples_per_s"] == best["samples_per_s"]
        assert cell["winner"] == f"{best['scheme']} / {best['codec']}"
        others = sorted((r["samples_per_s"] for r in eligible), reverse=True)
        if len(others) > 1:
            assert cell["margin_over_runner_up"] == pytest.approx(others[0] / others[1] - 1)
        assert f"| {cell['bandwidth']} | {cell['latency']} | {cell['winner']} |" in texts["page"]
    # at 10 Mbit/s the network needs a p too stale for the limit: p = auto is held within it
    slow = sm.cells_by_key(record)[("10mbps", "1ms")]
    held = [r for r in slow["rows"] if r["scheme"] == "ako p=auto" and r["codec"] == "none"]
    assert held[0]["eligible"]
    assert held[0]["staleness_bound_rounds"] <= record["max_staleness_rounds"]
