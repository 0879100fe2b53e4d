"""`--scheme NAME`: every named scheme stands for exactly its preset's settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from akocore.schemes.named import CORE_SCHEMES, NAMED_SCHEMES, SCHEME_NAMES, expansion
from akocore.schemes.registry import SCHEMES
from akocore.settings.layers import Given, Layer, resolve
from akocore.settings.toml_io import file_layer

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "configs" / "presets"
COMPARED = ("exchange", "train")


def test_every_preset_has_a_name_and_every_name_a_preset() -> None:
    assert sorted(path.stem for path in PRESETS.glob("*.toml")) == sorted(NAMED_SCHEMES)
    assert CORE_SCHEMES == SCHEMES
    assert set(SCHEME_NAMES) == set(CORE_SCHEMES) | set(NAMED_SCHEMES)


@pytest.mark.parametrize("name", sorted(NAMED_SCHEMES))
def test_a_name_resolves_to_its_preset(name: str) -> None:
    by_file = resolve(file_layer(PRESETS / f"{name}.toml")).config
    by_name = resolve([Given("exchange.scheme", name, Layer.FLAG, "by --scheme")]).config
    for section in COMPARED:
        assert getattr(by_name, section) == getattr(by_file, section), (name, section)
    assert by_name.exchange.scheme == NAMED_SCHEMES[name].core_scheme


def test_a_value_given_beside_the_name_wins_and_a_lower_layer_loses() -> None:
    same_layer = resolve([Given("exchange.scheme", "adag", Layer.FILE, "in x.toml"),
                          Given("exchange.push_every", 8, Layer.FILE, "in x.toml")]).config
    assert same_layer.exchange.push_every == 8 and same_layer.exchange.push_average
    below = resolve([Given("exchange.push_every", 8, Layer.SET, "by --set"),
                     Given("exchange.scheme", "adag", Layer.FLAG, "by --scheme")])
    assert below.config.exchange.push_every == 4
    assert "adag" in str(below.origin("exchange.push_every"))


def test_core_names_do_not_expand() -> None:
    assert all(expansion(name) is None for name in CORE_SCHEMES)
    assert expansion("downpour") is NAMED_SCHEMES["downpour"]


def test_the_per_worker_learning_rates_go_round_robin() -> None:
    from akocore.schemes.factory import SchemeSpec, build_nodes
    spec = SchemeSpec("ps", 8, ps_servers=1, ps_mode="sync", worker_lr_scale=(1.0, 0.5))
    scales = [float(node.lr_scale) for node in build_nodes(spec, 4, None, None)[:7]]
    assert scales == [1.0, 0.5, 1.0, 0.5, 1.0, 0.5, 1.0]


def _akosim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "akosim", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", ["sdag", "sync-sgd-lr-per-worker", "easgd"])
def test_akosim_plans_a_named_scheme(name: str) -> None:
    result = _akosim("--scheme", name, "--workers", "6", "--gradient-size", "1MB",
                     "--compute", "0.1s", "--rounds", "5", "--quiet")
    assert result.returncode == 0, result.stderr
    assert "ps" in result.stdout


def test_an_unknown_name_is_one_line_listing_the_names() -> None:
    result = _akosim("--scheme", "downpoor", "--rounds", "2")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert all(name in line for name in SCHEME_NAMES)


EXPECTED_BOUNDS = {"sync-sgd": 0.0, "sync-sgd-lr-per-worker": 0.0, "sdag": 3.0,
                   "hogwild": float("inf"), "downpour": float("inf"), "adag": float("inf"),
                   "easgd": 0.0, "wagma": 9.0, "muloco": 9.0}


@pytest.mark.parametrize("name", sorted(NAMED_SCHEMES))
def test_akosim_reports_each_named_schemes_staleness_bound(name: str) -> None:
    from akosim.planning.compute import ComputeModel
    from akosim.planning.runspec import configured_runs
    from akosim.sim.engine import StopRule
    from akosim.sim.scenario import Setup

    cfg = resolve([Given("exchange.scheme", name, Layer.FLAG, "by --scheme"),
                   Given("cluster.workers", 5, Layer.FLAG, "by --workers")]).config
    setup = Setup(cfg, 1000, ComputeModel(0.01), 16, StopRule(rounds=12, drain=True))
    (run,) = configured_runs(setup)
    assert run.staleness_bound_rounds == EXPECTED_BOUNDS[name]


def test_sdag_bound_follows_lambda_and_wagma_agrees_with_its_node() -> None:
    from akocore.schemes.base import Replica
    from akocore.schemes.registry import staleness_bound_rounds
    from akocore.schemes.wagma import WagmaWorker
    from akocore.settings.schema import ExchangeConfig

    for lam in (1, 2, 7):
        exchange = ExchangeConfig(scheme="ps", ps_mode="sync", local_steps=True, push_every=lam)
        assert staleness_bound_rounds("ps", exchange, p_max=1, ssp=0.0) == lam - 1
    for tau in (1, 5):
        node = WagmaWorker(0, 4, 2, replica=Replica(None, None), global_every=tau)
        assert staleness_bound_rounds("wagma", ExchangeConfig(scheme="wagma", global_every=tau),
                                      p_max=1, ssp=0.0) == node.staleness_bound


def _documented_bounds() -> dict[str, str]:
    page = (ROOT / "docs" / "guide" / "schemes.md").read_text()
    section = page.split("# Exchange schemes", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0].startswith("`") and not cells[0].startswith("`--"):
            rows[cells[0].split("`")[1]] = cells[3]
    return rows


def _evaluate(expression: str, exchange, p_max: int, ssp: float) -> float:
    names = {"p": p_max, "s": ssp, "lambda_": exchange.push_every, "tau": exchange.global_every,
             "inf": float("inf"), "H": exchange.inner_steps}
    if exchange.scheme == "streaming-diloco":
        names["tau"] = exchange.overlap_steps
    if exchange.scheme == "quorum-diloco":
        names["g"] = exchange.quorum_grace_steps
    if exchange.scheme == "sparta":
        names["f"] = exchange.sparta_fraction
    if exchange.scheme == "noloco":
        names["H"] = exchange.noloco_inner_steps
    return float(eval(expression.replace("lambda", "lambda_"), {"__builtins__": {}}, names))


@pytest.mark.parametrize("ssp", [0.0, 2.0])
def test_the_schemes_page_table_states_the_code_bounds(ssp: float) -> None:
    """Each row's bound, evaluated with the scheme's resolved knobs, is the code's figure."""
    from akocore.schemes.registry import staleness_bound_rounds

    rows = _documented_bounds()
    assert set(rows) == set(SCHEME_NAMES)
    p_max = 3
    for name, expression in rows.items():
        modes = ("sync", "async") if name == "ps" else (None,)
        parts = [part.split("(")[0].strip() for part in expression.split(",")]
        assert len(parts) == len(modes), (name, expression)
        for mode, part in zip(modes, parts, strict=True):
            givens = [Given("exchange.ssp", ssp, Layer.SET, "by --set"),
                      Given("exchange.push_every", 3, Layer.SET, "by --set"),
                      Given("exchange.scheme", name, Layer.FLAG, "by --scheme")]
            if mode:
                givens.append(Given("exchange.ps_mode", mode, Layer.FLAG, "by --set"))
            exchange = resolve(givens).config.exchange
            code = staleness_bound_rounds(exchange.scheme, exchange, p_max=p_max,
                                          ssp=exchange.ssp)
            assert _evaluate(part, exchange, p_max, exchange.ssp) == code, (name, mode, part)
