"""The public calls are plain functions whose signatures name every setting, typed; their
keyword settings enter the settings as the API layer (origin "api"), never as flag text;
a Workload object is taken as itself."""

from __future__ import annotations

import ast
import inspect
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

import akocore
import akorun
import akosim
from akocore.settings.api_layer import api_layer, config_layers, settings_keys
from akocore.settings.key_registry import Tool
from akocore.settings.layers import Given, Layer, resolve
from akocore.settings.normalise import ConfigError
from akocore.workloads.naming import (
    given_workload_name,
    load_workload_spec,
    parse_workload_name,
)

ROOT = Path(__file__).resolve().parent.parent
CALLS = [(akosim.plan, (Tool.AKOSIM, Tool.AKOSIM_PLAN)),
         (akosim.simulate, (Tool.AKOSIM, Tool.AKOSIM_PLAN)),
         (akosim.train, (Tool.AKOSIM, Tool.AKOSIM_PLAN)),
         (akosim.predict, (Tool.AKOSIM,)),
         (akorun.init, (Tool.AKORUN_INIT,)),
         (akorun.launch, (Tool.AKORUN_LAUNCH,)),
         (akorun.run_worker, (Tool.AKORUN_RANK,)),
         (akorun.Exchange, (Tool.AKORUN_RANK,))]


def test_the_public_calls_are_plain_functions() -> None:
    for call in (akosim.plan, akosim.simulate, akosim.train, akosim.predict, akosim.sweep,
                 akorun.launch,
                 akorun.init, akorun.run_worker, akorun.merge_run, akorun.load_params):
        assert inspect.isfunction(call), call
    assert inspect.isclass(akorun.Exchange)


@pytest.mark.parametrize(("call", "tools"), CALLS, ids=lambda c: getattr(c, "__name__", ""))
def test_a_signature_names_every_setting_of_its_command_typed(call, tools) -> None:
    parameters = inspect.signature(call).parameters
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    for name in settings_keys(tools):
        assert name in parameters, name
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert parameters[name].annotation is not inspect.Parameter.empty, name
    assert parameters["overrides"].default is None and "set" not in parameters
    assert parameters["workers"].annotation == int | None
    assert parameters["workers"].default is None  # not given: the layer below decides
    bandwidth = parameters["bandwidth"].annotation  # text with a unit, or SI numbers
    assert {str, float} <= set(getattr(bandwidth, "__args__", ()))


def test_a_call_names_its_own_options_with_their_types_and_defaults() -> None:
    plan = inspect.signature(akosim.plan).parameters
    assert plan["max_staleness"].annotation == int | None
    assert plan["straggler_factor"].default == 4.0
    assert plan["gradient_size"].annotation == str | int | None
    assert plan["network_model"].annotation == str | None  # --network-model's name
    assert plan["compute"].annotation == float | str | None  # an [akosim] setting
    launch = inspect.signature(akorun.launch).parameters
    assert launch["timeout"].annotation == str | float | None
    assert launch["peer_timeout"].annotation == float | str | None
    assert "peer_timeout" in inspect.signature(akorun.Exchange).parameters
    assert launch["emulate"].annotation == str | bool | None  # --emulate / --no-emulate


def test_a_sweep_from_python_is_the_commands_sweep(tmp_path: Path) -> None:
    from akosim.cli import main

    tiny = ["--gradient-size", "40KB", "--compute", "10ms", "--rounds", "3", "--jobs", "1"]
    assert main(["sweep", "--workers", "2,4", "--p", "1,2", *tiny, "--quiet",
                 "--out", str(tmp_path)]) == 0
    ran = sorted(path.name for path in (tmp_path / "points").iterdir())
    # the same grid, typed (seconds, a list): every point is found and skipped
    grid = akosim.sweep(tmp_path, workers=[2, 4], p=[1, 2], gradient_size=40_000,
                        compute=0.01, rounds=3, jobs=1)
    assert sorted(path.name for path in (tmp_path / "points").iterdir()) == ran
    assert [point.grid for point in grid.points] == [
        {"workers": w, "p": p} for w in ("2", "4") for p in ("1", "2")]
    assert inspect.signature(akosim.sweep).parameters["workers"].annotation == \
        int | Sequence[int] | None


def test_keyword_settings_are_the_api_layer_and_say_so() -> None:
    layers = api_layer({"workers": 8, "bandwidth": 40e6, "latency": "5ms", "lr": None},
                       (Tool.AKOSIM,), "akosim.plan")
    resolved = resolve(layers)
    assert resolved.config.cluster.workers == 8
    assert resolved.config.network.bandwidth_bps == (40e6,)  # an SI number from Python
    assert resolved.origin("cluster.workers").layer is Layer.API
    assert str(resolved.origin("cluster.workers")) == "api: workers=8"
    assert not resolved.given("train.lr")  # None: not given
    assert "cluster.workers = 8  (api: workers=8)" in resolved.describe()
    switched = resolve(api_layer({"emulate": False}, (Tool.AKORUN_LAUNCH,), "akorun.launch"))
    assert switched.akorun.emulate == "off"


def test_keywords_win_over_overrides_and_the_file(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text("[cluster]\nworkers = 5\n[train]\nlr = 0.2\nrounds = 7\n")
    layers = [*config_layers(config, {"train.lr": 0.3}),
              *api_layer({"workers": 6}, (Tool.AKOSIM,), "akosim.plan")]
    resolved = resolve(layers)
    assert (resolved.config.cluster.workers, resolved.config.train.lr,
            resolved.config.train.rounds) == (6, 0.3, 7)
    assert resolved.origin("train.lr").layer is Layer.SET
    assert str(resolved.origin("train.lr")) == "api: overrides['train.lr']"


def test_a_bare_number_is_refused_from_the_file_and_flag_layers_still() -> None:
    with pytest.raises(ConfigError, match="add a unit"):
        resolve([Given("network.bandwidth", 40, Layer.FLAG, "by --bandwidth")])
    with pytest.raises(TypeError, match="no setting 'wokers'.*workers"):
        api_layer({"wokers": 3}, (Tool.AKOSIM,), "akosim.plan")
    with pytest.raises(TypeError, match="dotted settings are overrides="):
        akosim.simulate(set={"exchange.ssp": 2})


def _calls_into_argparse(tree: ast.AST) -> list[int]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("parse_args", "parse_known_args", "parse_intermixed_args",
                        "build_parser", "parse_quietly"):
                found.append(node.lineno)
    return found


def test_the_finder_finds_a_call_into_argparse() -> None:
    tree = ast.parse("def plan(**settings):\n    return build_parser().parse_args(['x'])\n")
    assert _calls_into_argparse(tree) == [2, 2]


def test_no_function_that_takes_keyword_settings_parses_flags() -> None:
    """No argv is built from keywords: the API modules never reach argparse, and no
    function of the packages that takes ``**settings`` calls a parser."""
    for module in ("akosim/sim_api.py", "akorun/run_api.py"):
        assert _calls_into_argparse(ast.parse((ROOT / module).read_text())) == [], module
    offenders = []
    for package in ("akocore", "akosim", "akorun"):
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and \
                        node.args.kwarg is not None and _calls_into_argparse(node):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert offenders == []


def test_a_workload_object_is_kept_as_itself_not_as_a_module() -> None:
    x = np.zeros((8, 2), np.float32)
    workload = akocore.Workload(init=lambda seed: {"w": np.zeros(2, np.float32)},
                                loss=lambda params, batch, rng: 0.0,
                                evaluate=lambda params, batch: 0.5,
                                data=akocore.ArrayData(x, np.zeros(8, np.int32), x,
                                                       np.zeros(8, np.int32)))
    modules = set(sys.modules)
    name = given_workload_name(workload)
    assert name.startswith("<object>:") and given_workload_name(workload) == name
    assert set(sys.modules) == modules  # no stand-in module
    loaded = load_workload_spec(parse_workload_name(name))
    assert loaded.init is workload.init and loaded.loss is workload.loss
    with pytest.raises(TypeError, match="expected a name or an akocore.Workload"):
        given_workload_name(object())  # type: ignore[arg-type]


def test_every_project_import_names_a_module_of_this_tree() -> None:
    """After the packages that posed as functions were renamed (akosim.planning,
    akosim.prediction, akosim.sweeping, akorun.launching), no import names the old path
    (an installed copy elsewhere would answer it)."""
    from tests.test_architecture import imported_names, module_name, project_modules

    modules = project_modules()
    offenders = []
    for module, path in modules.items():
        for name in imported_names(path, module):
            root = name.split(".")[0]
            if root not in ("akocore", "akosim", "akorun", "analysis") or name in modules:
                continue
            parent = name.rpartition(".")[0]  # "from package import name": name a member
            if parent not in modules:
                offenders.append(f"{module_name(path)} imports {name}")
    assert offenders == []
