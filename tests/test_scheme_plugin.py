"""A scheme with a knob added in two places (its module and one registry entry) runs in
both backends: akosim plans it, akorun trains it, and every edge of the settings (TOML
table, flat key, --set, the flag, the record) knows its knob without being told.

The scheme is tests/solo_scheme.py. In this process it is registered for the length of
a test (`registering`); akorun's processes register it at start because
``$AKO_SCHEME_MODULES`` names the module.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from akocore.schemes.registry import SCHEME_MODULES_ENV, registered, registering
from akocore.settings.key_registry import Tool, current, flag_keys
from akocore.settings.layers import resolve
from akocore.settings.normalise import ConfigError
from akocore.settings.schema import RunConfig
from akocore.settings.toml_io import config_hash, config_to_dict, parse_toml_text, set_layer
from akocore.workloads.flat import build_workload
from akorun.testing import REPO_ROOT, akorun_command, child_test_env
from tests.solo_scheme import SOLO, SoloSettings

PLUGIN = "tests.solo_scheme"
SETTINGS = Path(__file__).resolve().parent.parent / "akocore" / "settings"


def test_no_module_of_the_settings_names_a_schemes_knob() -> None:
    """The knobs are the schemes' business: the settings package reads them from the
    registered settings classes and never names one (no attribute, keyword or key text)."""
    import ast

    from akocore.schemes.registry import settings_tables

    knobs = {name for kind in settings_tables().values() for name in kind.names()}
    offenders = []
    for path in sorted(SETTINGS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            named = (node.attr if isinstance(node, ast.Attribute) else
                     node.arg if isinstance(node, ast.keyword) else
                     node.value if isinstance(node, ast.Constant) else None)
            if named in knobs:
                offenders.append(f"{path.name}:{node.lineno} {named}")
    assert offenders == []


def test_the_knob_is_a_setting_in_every_layer_while_the_scheme_is_registered() -> None:
    before = config_hash(RunConfig())
    with registering(SOLO):
        assert "exchange.solo_scale" in current().by_dotted
        assert "--solo-scale" in {key.flag for key in flag_keys(Tool.AKOSIM)}
        table = parse_toml_text('[exchange]\nscheme = "solo"\n[exchange.solo]\n'
                                'solo_scale = 0.25\n')
        flat = parse_toml_text('[exchange]\nscheme = "solo"\nsolo_scale = 0.25\n')
        assert table == flat and table.exchange.knobs(SoloSettings).solo_scale == 0.25
        assert table.exchange.solo_scale == 0.25
        by_set = resolve(set_layer(["exchange.solo.solo_scale=0.5"])).config
        assert by_set.exchange.solo_scale == 0.5
        assert config_to_dict(table)["exchange"]["solo_scale"] == 0.25
        assert SOLO.variant_label(table.exchange) == "solo scale=0.25"
        with pytest.raises(ConfigError, match=r"exchange.solo_scale: got -1"):
            parse_toml_text("[exchange.solo]\nsolo_scale = -1\n")
        with pytest.raises(ConfigError, match=r"known keys in \[exchange.solo\]: solo_scale"):
            parse_toml_text("[exchange.solo]\nsolo_scal = 1\n")
    assert "solo" not in registered() and "exchange.solo_scale" not in current().by_dotted
    assert config_hash(RunConfig()) == before  # the run of the built-in schemes is as it was


def test_the_settings_reference_lists_every_key_and_a_registered_schemes_table() -> None:
    from akocore.settings.reference import reference_markdown

    text = reference_markdown()
    assert all(f"| `{key.name}` |" in text for key in current().keys)
    assert "### [exchange.diloco]" in text and "[exchange.solo]" not in text
    with registering(SOLO):
        text = reference_markdown()
        assert "### [exchange.solo]" in text and "| `solo_scale` | `--solo-scale` |" in text
        assert "solo (every worker trains alone" in current().by_dotted[
            "exchange.scheme"].flag_help


def test_akosim_plans_the_scheme_with_its_knob_from_the_flag(capsys) -> None:
    from akosim.cli import main

    with registering(SOLO):
        assert main(["--scheme", "solo", "--solo-scale", "0.5", "--workers", "3",
                     "--gradient-size", "40KB", "--compute", "10ms", "--rounds", "5",
                     "--quiet"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("solo"))
    assert "scale=0.5" in row and "10 ms" in row and " 0 B" in row  # compute alone


def test_the_planner_times_the_values_of_the_schemes_own_plan_grid() -> None:
    """The scheme's `plan_grid` names knob values the staleness bound does not show: the
    plan's candidates hold each (timing alike, so no front may prune them)."""
    from akosim.planning.compare import compare_all
    from akosim.planning.pareto_candidates import pareto_candidates
    from tests.test_plan_advice import _setup

    with registering(SOLO):
        setup = _setup(n=3, rounds=12)
        setup = replace(setup, config=replace(setup.config, exchange=replace(
            setup.config.exchange, scheme="solo")))
        chosen = pareto_candidates(setup, compare_all(setup), max_staleness_rounds=8,
                                   training_rounds=12)
        labels = {c.variant.label for c in chosen if c.timing.scheme == "solo"}
    assert {"solo scale=0", "solo scale=0.5"} <= labels, labels


def test_a_scheme_module_that_cannot_be_imported_is_a_one_line_usage_error(
        monkeypatch, capsys) -> None:
    from akosim.cli import main

    monkeypatch.setenv(SCHEME_MODULES_ENV, "tests.no_such_scheme_module")
    with pytest.raises(SystemExit) as exit_info:
        main(["--workers", "3", "--quiet"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tests.no_such_scheme_module" in err


@pytest.mark.timeout(150)
def test_akorun_trains_the_scheme_registered_in_every_rank_by_the_environment(
        tmp_path: Path) -> None:
    """--solo-scale 0: every step is scaled to nothing, so each replica ends at the
    initial parameters; with the knob lost (the default 1) the replicas would move."""
    out = tmp_path / "run"
    command = akorun_command("launch", "--workers", "2", "--rounds", "4", "--lr", "0.1",
                             "--optimizer", "sgd", "--workload", "digits-mlp",
                             "--scheme", "solo", "--solo-scale", "0", "--out", str(out),
                             "--quiet", "--timeout", "120s")
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT,
                            env=child_test_env({SCHEME_MODULES_ENV: PLUGIN}), timeout=140)
    assert result.returncode == 0, result.stderr
    merged = json.loads((out / "result.json").read_text())
    assert merged["scheme"] == "solo"
    assert [w["rounds"] for w in merged["per_worker"]] == [4, 4]
    theta0 = np.array(build_workload("digits-mlp").init_params)
    for rank in range(2):
        with np.load(out / f"worker-{rank}.npz") as data:
            np.testing.assert_array_equal(np.array(data["params"]), theta0)
