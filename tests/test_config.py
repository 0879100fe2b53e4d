"""The run settings (akocore.settings): defaults, TOML, matrices, list assignment,
overrides, CLI precedence, errors."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from akocore.settings.cli_flags import (
    add_akorun_arguments,
    add_shared_arguments,
    config_from_args,
    resolve_args,
)
from akocore.settings.key_registry import KEYS, RUN_SECTIONS, SECTION_TYPES, Key, Tool
from akocore.settings.layers import Given, Layer, Origin, ResolvedSettings, layer_of, resolve
from akocore.settings.normalise import ConfigError
from akocore.settings.schema import (
    ClusterConfig,
    ExchangeConfig,
    NetworkConfig,
    RunConfig,
    TrainConfig,
)
from akocore.settings.toml_io import (
    apply_overrides,
    config_from_dict,
    config_hash,
    config_to_dict,
    load_config,
    parse_toml_text,
    replace_in,
    set_layer,
)

FULL_TOML = """
[cluster]
workers = 3
hosts = ["10.0.0.1:7000", "10.0.0.2:7000", "[::1]:7001"]

[network]
bandwidth = ["800mbps", "400mbps"]
link_bandwidth = "40,20,10mbps"
latency = "5ms"

[exchange]
scheme = "ako"
p = [4, 2, 1]
ssp = "inf"
schedule = "aligned"
reduce = "sum"
utilisation = 0.8
p_max = 64
ps_servers = "best"
ps_mode = "async"
push_every = 2
fetch_every = 3

[train]
workload = "digits-mlp"
optimizer = "adam"
lr = 0.001
batch_size = 64
seed = 7
rounds = 500
duration = "5m"
target_accuracy = 0.95
eval_every = 5
data_path = "/data/mnist.npz"
"""


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="akotest")
    add_shared_arguments(parser)
    return parser


def from_argv(argv: list[str], defaults: RunConfig | None = None) -> RunConfig:
    return config_from_args(make_parser().parse_args(argv), defaults)


def error_of(call, *args) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        call(*args)
    return str(info.value)


# --------------------------------------------------------------------------- defaults


def test_defaults_are_valid_and_as_documented() -> None:
    cfg = RunConfig()
    assert cfg.cluster == ClusterConfig(workers=4, hosts=())
    assert cfg.network.bandwidth_bps == (1e9,)
    assert cfg.network.link_bandwidth_bps == ()
    assert cfg.network.latency_s == (0.0,)
    assert cfg.exchange.scheme == "ako" and cfg.exchange.p == "auto" and cfg.exchange.ssp == 0
    assert cfg.train.rounds == 100 and cfg.train.duration_s is None
    assert config_from_dict({}) == cfg
    assert parse_toml_text("") == cfg


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_dataclasses_are_frozen() -> None:
    with pytest.raises(AttributeError):
        RunConfig().train.lr = 1.0  # type: ignore[misc]


# --------------------------------------------------------------------------- TOML


def test_full_toml_is_read_into_si_units(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(FULL_TOML)
    cfg = load_config(path)
    assert cfg.cluster.workers == 3
    assert cfg.cluster.hosts == ("10.0.0.1:7000", "10.0.0.2:7000", "[::1]:7001")
    assert cfg.network.bandwidth_bps == (800e6, 400e6)
    assert cfg.network.link_bandwidth_bps == (40e6, 20e6, 10e6)
    assert cfg.network.latency_s == (0.005,)
    assert cfg.exchange == ExchangeConfig(
        scheme="ako", p=(4, 2, 1), ssp=math.inf, schedule="aligned", reduce="sum",
        utilisation=0.8, p_max=64, ps_servers="best", ps_mode="async", push_every=2,
        fetch_every=3,
    )
    assert cfg.train == TrainConfig(
        workload="digits-mlp", optimizer="adam", lr=0.001, batch_size=64, seed=7, rounds=500,
        duration_s=300.0, target_accuracy=0.95, eval_every=5, data_path="/data/mnist.npz",
    )


def test_toml_round_trip_through_file_and_json(tmp_path: Path) -> None:
    cfg = parse_toml_text(FULL_TOML)
    echoed = config_to_dict(cfg)
    text = json.dumps(echoed)  # JSON-serialisable: no inf floats
    assert "Infinity" not in text
    assert config_from_dict(json.loads(text)) == cfg


def test_config_to_dict_is_human() -> None:
    d = config_to_dict(parse_toml_text(FULL_TOML))
    assert d["network"]["bandwidth"] == ["800Mbps", "400Mbps"]
    assert d["network"]["latency"] == ["5ms"]
    assert d["exchange"]["ssp"] == "inf"
    assert d["exchange"]["p"] == [4, 2, 1]
    assert d["train"]["duration"] == "5min"


@pytest.mark.parametrize(
    "cfg",
    [
        RunConfig(),
        RunConfig(train=TrainConfig(rounds=None, duration_s=12.5)),
        RunConfig(
            cluster=ClusterConfig(workers=2),
            network=NetworkConfig(
                bandwidth_bps=(123456789.0, 3.5e9),
                link_bandwidth_matrix_bps=((math.inf, 1e6), (2e6, math.inf)),
                latency_matrix_s=((0.0, 1e-4), (0.25, 0.0)),
            ),
            exchange=ExchangeConfig(p=(3,), ssp=2, ps_servers=1),
            train=TrainConfig(rounds=None, target_accuracy=0.5),
        ),
    ],
)
def test_round_trip(cfg: RunConfig) -> None:
    assert config_from_dict(config_to_dict(cfg)) == cfg
    assert config_from_dict(json.loads(json.dumps(config_to_dict(cfg)))) == cfg


def test_dataclasses_normalise_their_inputs() -> None:
    network = NetworkConfig(bandwidth_bps=1e9, latency_s=[0.001])  # type: ignore[arg-type]
    assert network.bandwidth_bps == (1e9,)
    assert network.latency_s == (0.001,)
    exchange = ExchangeConfig(p=4, ssp=2)  # type: ignore[arg-type]
    assert exchange.p == (4,) and exchange.ssp == 2.0 and isinstance(exchange.ssp, float)
    assert TrainConfig(lr=1).lr == 1.0 and isinstance(TrainConfig(lr=1).lr, float)


def test_toml_value_spellings() -> None:
    cfg = config_from_dict(
        {
            "network": {"bandwidth": "500mbps", "latency": ["1ms", "2ms"], "link_bandwidth": []},
            "exchange": {"p": 4, "ssp": 2},
            "train": {"rounds": "none", "duration": "60s"},
        }
    )
    assert cfg.network.bandwidth_bps == (5e8,)
    assert cfg.network.latency_s == (0.001, 0.002)
    assert cfg.exchange.p == (4,)
    assert cfg.exchange.ssp == 2.0
    assert cfg.train.rounds is None and cfg.train.duration_s == 60.0
    assert config_from_dict({"exchange": {"ssp": math.inf}}).exchange.ssp == math.inf
    assert config_from_dict({"exchange": {"p": "auto-per-worker"}}).exchange.p == "auto-per-worker"


@pytest.mark.parametrize(("tables", "needle"), [
    ({"network": {"bandwidth": 5e8}}, "network.bandwidth = 500000000.0: add a unit, e.g. "),
    ({"network": {"latency": [1, "2ms"]}}, "network.latency = [1, '2ms']: add a unit"),
    ({"network": {"link_bandwidth": "40,20"}}, "add a unit, e.g. 40mbps"),
    ({"train": {"duration": 60}}, "train.duration = 60: add a unit, e.g. 60s"),
    ({"network": {"latency_matrix": [[0, "5ms"], [5, 0]]}}, "entry [1][0] 5: add a unit, e.g. 5ms"),
])
def test_bare_numbers_are_refused_where_a_unit_belongs(tables: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        config_from_dict(tables)


def test_zero_and_inf_need_no_unit_and_keys_named_with_units_take_numbers() -> None:
    cfg = config_from_dict({"cluster": {"workers": 2}, "network": {"latency": 0,
                                                                   "link_bandwidth_matrix": [
        [0, "inf"], ["inf", 0]]}, "exchange": {"utilisation": 0.5}})
    assert cfg.network.latency_s == (0.0,)
    assert cfg.exchange.utilisation == 0.5


def test_duration_without_rounds_in_toml_stops_by_time() -> None:
    assert parse_toml_text('[train]\nduration = "300s"').train.rounds is None
    assert parse_toml_text("[train]\ntarget_accuracy = 0.9").train.rounds is None
    both = parse_toml_text('[train]\nduration = "300s"\nrounds = 10')
    assert both.train.rounds == 10 and both.train.duration_s == 300.0


# --------------------------------------------------------------------------- network assignment


def test_pair_list_assignment_order_and_symmetry() -> None:
    network = config_from_dict({"network": {"link_bandwidth": "40,20,10mbps"}}).network
    m = network.link_bps_matrix(3)
    assert m.shape == (3, 3)
    assert m[0, 1] == m[1, 0] == 40e6
    assert m[0, 2] == m[2, 0] == 20e6
    assert m[1, 2] == m[2, 1] == 10e6
    assert np.all(np.isinf(np.diag(m)))


def test_pair_list_wraps_round_robin() -> None:
    network = NetworkConfig(link_bandwidth_bps=(1.0, 2.0), latency_s=(0.1, 0.2, 0.3))
    m = network.link_bps_matrix(4)
    # pairs in order: (0,1) (0,2) (0,3) (1,2) (1,3) (2,3)
    assert [m[0, 1], m[0, 2], m[0, 3], m[1, 2], m[1, 3], m[2, 3]] == [1, 2, 1, 2, 1, 2]
    lat = network.latency_matrix(4)
    assert [lat[0, 1], lat[0, 2], lat[0, 3], lat[1, 2], lat[1, 3], lat[2, 3]] == [
        0.1, 0.2, 0.3, 0.1, 0.2, 0.3,
    ]
    assert np.array_equal(lat, lat.T)
    assert np.all(np.diag(lat) == 0)


def test_no_link_cap_is_inf_everywhere() -> None:
    m = NetworkConfig().link_bps_matrix(3)
    assert np.all(np.isinf(m))
    assert np.all(NetworkConfig().latency_matrix(3) == 0)


def test_node_bandwidth_list_round_robin() -> None:
    network = config_from_dict({"network": {"bandwidth": ["800mbps", "400mbps"]}}).network
    assert network.uplink_bps(5).tolist() == [800e6, 400e6, 800e6, 400e6, 800e6]
    assert network.downlink_bps(3).tolist() == [800e6, 400e6, 800e6]
    single = NetworkConfig(bandwidth_bps=(1e9,))
    assert single.uplink_bps(4).tolist() == [1e9] * 4


def test_full_matrices_from_toml_override_lists() -> None:
    cfg = parse_toml_text(
        """
        [cluster]
        workers = 3
        [network]
        link_bandwidth = "1gbps"
        latency = "9ms"
        link_bandwidth_matrix = [["-", "40mbps", "inf"],
                                 ["20mbps", 0, "10mbps"],
                                 ["1gbps", "2gbps", "x"]]
        latency_matrix = [[0, "5ms", "1ms"], ["6ms", 0, "2ms"], ["1ms", "3ms", 0]]
        """
    )
    m = cfg.network.link_bps_matrix(3)
    assert m.tolist() == [
        [math.inf, 40e6, math.inf],
        [20e6, math.inf, 10e6],
        [1e9, 2e9, math.inf],
    ]  # ordered (sender, receiver), diagonal ignored
    lat = cfg.network.latency_matrix(3)
    assert lat.tolist() == [[0, 0.005, 0.001], [0.006, 0, 0.002], [0.001, 0.003, 0]]
    assert config_from_dict(config_to_dict(cfg)) == cfg


def test_matrix_shape_is_checked_against_workers() -> None:
    message = error_of(
        config_from_dict,
        {"cluster": {"workers": 3}, "network": {"latency_matrix": [[0, "1ms"], ["1ms", 0]]}},
    )
    assert message.startswith("network.latency_matrix: got a 2x2 matrix, expected 3x3")
    network = NetworkConfig(latency_matrix_s=((0.0, 1.0), (1.0, 0.0)))
    with pytest.raises(ConfigError, match="expected 4x4"):
        network.latency_matrix(4)


def test_ragged_matrix_is_rejected() -> None:
    message = error_of(
        config_from_dict,
        {"cluster": {"workers": 2},
         "network": {"link_bandwidth_matrix": [[0, "1gbps"], ["1gbps"]]}},
    )
    assert "network.link_bandwidth_matrix: row 1 has 1 entries" in message


def test_matrix_entry_error_names_position() -> None:
    message = error_of(
        config_from_dict,
        {"cluster": {"workers": 2},
         "network": {"link_bandwidth_matrix": [[0, "fast"], ["1gbps", 0]]}},
    )
    assert "network.link_bandwidth_matrix[0][1]: got 'fast'" in message


# --------------------------------------------------------------------------- overrides


def test_apply_overrides_reads_toml_values_and_bare_strings() -> None:
    cfg = apply_overrides(
        RunConfig(),
        [
            "train.lr=0.1",
            "network.bandwidth=40mbps",
            "network.link_bandwidth=40,20,10mbps",
            "exchange.p=auto-per-worker",
            "exchange.ssp=inf",
            "cluster.workers=8",
            "train.workload=\"cifar10-cnn\"",
            "train.duration=300s",
        ],
    )
    assert cfg.train.lr == 0.1
    assert cfg.network.bandwidth_bps == (40e6,)
    assert cfg.network.link_bandwidth_bps == (40e6, 20e6, 10e6)
    assert cfg.exchange.p == "auto-per-worker"
    assert cfg.exchange.ssp == math.inf
    assert cfg.cluster.workers == 8
    assert cfg.train.workload == "cifar10-cnn"
    assert cfg.train.duration_s == 300.0
    assert cfg.train.rounds == 100  # literal: only the named keys change


def test_apply_overrides_lists_and_later_wins() -> None:
    cfg = apply_overrides(RunConfig(), ["exchange.p=[4,2,1,1]", "train.lr=0.2", "train.lr=0.3"])
    assert cfg.exchange.p == (4, 2, 1, 1)
    assert cfg.train.lr == 0.3
    assert apply_overrides(cfg, ["exchange.p=4,2,1,1"]).exchange.p == (4, 2, 1, 1)


@pytest.mark.parametrize("item", ["train.lr", "lr=0.1", "train.lr.x=1", ".lr=1", "=1"])
def test_malformed_set_explains_the_form(item: str) -> None:
    message = error_of(apply_overrides, RunConfig(), [item])
    assert "section.key=value" in message
    assert repr(item) in message


def test_replace_in_changes_one_key() -> None:
    cfg = replace_in(RunConfig(), "network.latency", "5ms")
    assert cfg.network.latency_s == (0.005,)
    assert replace_in(cfg, "train.lr", 0.5).train.lr == 0.5
    assert replace_in(cfg, "train.lr", 0.5).network == cfg.network


# --------------------------------------------------------------------------- CLI


def test_shared_arguments_default_to_none_and_live_in_their_group() -> None:
    parser = make_parser()
    args = parser.parse_args([])
    assert all(value is None for value in vars(args).values())
    assert config_from_args(args) == RunConfig()
    titles = [group.title for group in parser._action_groups]
    assert "shared run settings" in titles
    help_text = parser.format_help()
    for flag in ("--config", "--set", "--workers", "--bandwidth", "--link-bandwidth",
                 "--latency", "--p", "--ssp", "--schedule", "--scheme", "--workload",
                 "--optimizer", "--lr", "--batch-size", "--seed", "--rounds", "--duration",
                 "--target-accuracy"):
        assert flag in help_text


def test_precedence_defaults_file_set_flags(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(
        '[cluster]\nworkers = 6\n[train]\nlr = 0.01\nbatch_size = 16\nseed = 3\n'
        '[network]\nbandwidth = "100mbps"\n'
    )
    cfg = from_argv(
        [
            "--config", str(path),
            "--set", "train.lr=0.02", "--set", "train.batch_size=8",
            "--set", "network.bandwidth=200mbps",
            "--lr", "0.03",
            "--bandwidth", "40,20mbps",
        ]
    )
    assert cfg.train.lr == 0.03  # flag beats --set beats file
    assert cfg.train.batch_size == 8  # --set beats file
    assert cfg.train.seed == 3  # file beats default
    assert cfg.cluster.workers == 6
    assert cfg.train.optimizer == "sgd"  # default
    assert cfg.network.bandwidth_bps == (40e6, 20e6)


def test_all_flags_reach_their_keys() -> None:
    cfg = from_argv(
        ["--workers", "3", "--bandwidth", "1gbps", "--link-bandwidth", "40,20,10mbps",
         "--latency", "5ms", "--p", "4,2,1", "--ssp", "inf", "--schedule", "aligned",
         "--scheme", "ps", "--workload", "mnist-mlp", "--optimizer", "momentum", "--lr", "0.2",
         "--batch-size", "8", "--seed", "5", "--rounds", "7", "--duration", "2m",
         "--target-accuracy", "0.75"]
    )
    assert cfg == RunConfig(
        cluster=ClusterConfig(workers=3),
        network=NetworkConfig(bandwidth_bps=(1e9,), link_bandwidth_bps=(40e6, 20e6, 10e6),
                              latency_s=(0.005,)),
        exchange=ExchangeConfig(scheme="ps", p=(4, 2, 1), ssp=math.inf, schedule="aligned"),
        train=TrainConfig(workload="mnist-mlp", optimizer="momentum", lr=0.2, batch_size=8,
                          seed=5, rounds=7, duration_s=120.0, target_accuracy=0.75),
    )


def test_duration_flag_alone_stops_by_time() -> None:
    cfg = from_argv(["--duration", "300s"])
    assert cfg.train.rounds is None and cfg.train.duration_s == 300.0
    assert from_argv(["--target-accuracy", "0.9"]).train.rounds is None


def test_rounds_flag_alone_clears_nothing() -> None:
    cfg = from_argv(["--rounds", "50"], defaults=RunConfig(train=TrainConfig(duration_s=60.0)))
    assert cfg.train.rounds == 50 and cfg.train.duration_s == 60.0


def test_duration_flag_keeps_rounds_from_file_or_set(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[train]\nrounds = 200\n")
    assert from_argv(["--config", str(path), "--duration", "5m"]).train.rounds == 200
    assert from_argv(["--set", "train.rounds=30", "--duration", "5m"]).train.rounds == 30
    both = from_argv(["--rounds", "40", "--duration", "5m"])
    assert both.train.rounds == 40 and both.train.duration_s == 300.0


def test_flag_values_are_validated_like_toml() -> None:
    message = error_of(from_argv, ["--workers", "1"])
    assert message.startswith("cluster.workers: got 1, expected an integer >= 2")
    assert "--workers" in message
    assert "network.bandwidth: cannot read bandwidth '40 furlongs'" in error_of(
        from_argv, ["--bandwidth", "40 furlongs"]
    )


def test_error_names_the_layer_that_gave_the_value(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[exchange]\nscheme = "ring"\n')
    message = error_of(from_argv, ["--config", str(path)])
    assert message.startswith("exchange.scheme: got 'ring', expected one of ako, ps, allreduce")
    assert str(path) in message
    assert "--set train.lr=-1" in error_of(from_argv, ["--set", "train.lr=-1"])


def test_choice_flags_are_checked_by_argparse() -> None:
    with pytest.raises(SystemExit):
        make_parser().parse_args(["--scheme", "ring"])


# --------------------------------------------------------------------------- error messages


def test_unknown_key_suggests_the_closest() -> None:
    message = error_of(config_from_dict, {"network": {"bandwith": "40mbps"}})
    assert "network.bandwith: unknown key" in message
    assert "did you mean 'bandwidth'?" in message
    assert "link_bandwidth" in message  # lists the known keys


def test_unknown_section_suggests_the_closest() -> None:
    message = error_of(config_from_dict, {"netwrk": {}})
    assert "unknown section [netwrk]" in message and "did you mean 'network'?" in message


def test_unknown_key_in_set() -> None:
    message = error_of(apply_overrides, RunConfig(), ["train.learning_rate=0.1"])
    assert "train.learning_rate: unknown key" in message


def test_section_must_be_a_table() -> None:
    assert "expected a table" in error_of(parse_toml_text, "train = 4")


def test_bad_scheme() -> None:
    message = error_of(config_from_dict, {"exchange": {"scheme": "ring"}})
    assert message == ("exchange.scheme: got 'ring', expected one of ako, ps, allreduce, "
                       "wagma, diloco, streaming-diloco, quorum-diloco, "
                       "sparseloco, sparta, noloco")


def test_workers_must_be_at_least_two() -> None:
    message = error_of(config_from_dict, {"cluster": {"workers": 1}})
    assert message == "cluster.workers: got 1, expected an integer >= 2"
    with pytest.raises(ConfigError):
        ClusterConfig(workers=1)


def test_p_tuple_must_have_one_value_or_one_per_worker() -> None:
    message = error_of(config_from_dict, {"cluster": {"workers": 4}, "exchange": {"p": [4, 2, 1]}})
    assert message.startswith("exchange.p: got 3 values [4, 2, 1]")
    assert "one per worker (cluster.workers = 4)" in message
    ok = config_from_dict({"cluster": {"workers": 3}, "exchange": {"p": [4, 2, 1]}})
    assert ok.exchange.p == (4, 2, 1)


@pytest.mark.parametrize("p", [0, [4, 0], "fast", [], 1.5, [True]])
def test_p_values_must_be_at_least_one(p: object) -> None:
    assert error_of(config_from_dict, {"exchange": {"p": p}}).startswith("exchange.p: got")


@pytest.mark.parametrize("ssp", [-1, "-1", 1.5, "fast", "-inf"])
def test_ssp_must_be_whole_and_non_negative(ssp: object) -> None:
    message = error_of(config_from_dict, {"exchange": {"ssp": ssp}})
    assert message.startswith("exchange.ssp: got")
    assert ">= 0, or inf" in message


def test_hosts_must_match_workers() -> None:
    message = error_of(config_from_dict, {"cluster": {"workers": 3, "hosts": ["a:1", "b:2"]}})
    assert "cluster.hosts: got 2 hosts, expected one per worker" in message
    assert "host:port" in error_of(config_from_dict, {"cluster": {"workers": 2,
                                                                    "hosts": ["a", "b:1"]}})


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("exchange", "utilisation", 0),
        ("exchange", "utilisation", 1.5),
        ("exchange", "p_max", 0),
        ("exchange", "ps_servers", 0),
        ("exchange", "ps_servers", 4),  # must leave at least one worker
        ("exchange", "ps_mode", "eventual"),
        ("exchange", "push_every", 0),
        ("exchange", "reduce", "max"),
        ("exchange", "schedule", "random"),
        ("train", "optimizer", "lbfgs"),
        ("train", "lr", 0),
        ("train", "lr", "nan"),
        ("train", "batch_size", 0),
        ("train", "seed", -1),
        ("train", "rounds", 0),
        ("train", "duration", "0s"),
        ("train", "target_accuracy", 1.5),
        ("train", "eval_every", 0),
        ("train", "workload", ""),
        ("network", "bandwidth", "0mbps"),
        ("network", "latency", "-5ms"),
        ("cluster", "workers", "four"),
        ("cluster", "workers", True),
    ],
)
def test_each_bad_value_names_its_key(section: str, key: str, value: object) -> None:
    message = error_of(config_from_dict, {section: {key: value}})
    assert message.startswith(f"{section}.{key}")


def test_no_stopping_condition_is_an_error() -> None:
    message = error_of(config_from_dict, {"train": {"rounds": "none"}})
    assert "at least one of rounds, duration and target_accuracy" in message


def test_bad_toml_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[train]\nlr = \n")
    message = error_of(load_config, path)
    assert str(path) in message
    assert "line 2" in message
    assert str(path) in error_of(from_argv, ["--config", str(path)])


def test_value_errors_in_a_file_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[cluster]\nworkers = 1\n")
    message = error_of(load_config, path)
    assert message.startswith(f"{path}: cluster.workers: got 1")


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    assert "not found" in error_of(load_config, tmp_path / "nope.toml")


# --------------------------------------------------------------------------- hash


def test_config_hash_is_stable_and_sensitive() -> None:
    cfg = parse_toml_text(FULL_TOML)
    digest = config_hash(cfg)
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert config_hash(parse_toml_text(FULL_TOML)) == digest
    assert config_hash(config_from_dict(config_to_dict(cfg))) == digest
    assert config_hash(replace_in(cfg, "train.lr", 0.002)) != digest
    other_hosts = replace_in(cfg, "cluster.hosts", ["h1:1", "h2:2", "h3:3"])
    assert other_hosts != cfg
    assert config_hash(other_hosts) == digest


def test_config_hash_of_defaults_is_pinned() -> None:
    # Pinned so that an accidental change to the canonical form is noticed: every
    # rank of a run must compute the same hash, across versions of this module. (Changed
    # when exchange.outer_sync and exchange.flush came: DiLoCo's sync became an all-reduce
    # and Ako's flush averages, so ranks of the version before cannot join a run of this
    # one anyway; and when the [exchange.sparseloco], [exchange.quorum],
    # [exchange.sparta] and [exchange.noloco] keys came.)
    assert config_hash(RunConfig()) == (
        "b476575400a07d73b6c3c0401042c7c676f492efa59efe754e4478be9bf59a46"
    )


# --------------------------------------------------------------------------- layers and origins


def test_each_layer_overrides_the_one_below_and_reports_itself(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[train]\nlr = 0.01\n[akorun]\npeer_timeout = \"3s\"\n")
    parser = argparse.ArgumentParser()
    add_shared_arguments(parser)
    add_akorun_arguments(parser, Tool.AKORUN_RANK)

    def resolved(*argv: str) -> ResolvedSettings:
        return resolve_args(parser.parse_args(list(argv)))

    plain = resolved()
    assert plain.config.train.lr == 0.05 and plain.origin("train.lr").layer is Layer.DEFAULT
    from_file = resolved("--config", str(path))
    assert from_file.config.train.lr == 0.01
    assert from_file.origin("train.lr") == Origin(Layer.FILE, f"in {path}")
    assert from_file.akorun.peer_timeout_s == 3.0
    assert from_file.origin("akorun.peer_timeout").layer is Layer.FILE
    over_set = resolved("--config", str(path), "--set", "train.lr=0.02",
                        "--set", "akorun.peer_timeout=4s")
    assert over_set.config.train.lr == 0.02 and over_set.akorun.peer_timeout_s == 4.0
    assert over_set.origin("train.lr") == Origin(Layer.SET, "by --set train.lr=0.02")
    assert over_set.origin("akorun.peer_timeout").layer is Layer.SET
    over_flag = resolved("--config", str(path), "--set", "train.lr=0.02", "--lr", "0.03",
                         "--set", "akorun.peer_timeout=4s", "--peer-timeout", "5s")
    assert over_flag.config.train.lr == 0.03 and over_flag.akorun.peer_timeout_s == 5.0
    assert over_flag.origin("train.lr") == Origin(Layer.FLAG, "by --lr")
    assert over_flag.origin("akorun.peer_timeout") == Origin(Layer.FLAG, "by --peer-timeout")
    assert over_flag.origin("train.batch_size").layer is Layer.DEFAULT
    assert any(line.startswith("train.lr = 0.03  (by --lr)") for line in over_flag.describe())


@pytest.mark.parametrize("layers, rounds", [
    ([], 100),
    ([("train.duration", "5s", Layer.FLAG)], None),
    ([("train.target_accuracy", 0.9, Layer.FILE)], None),
    ([("train.duration", "none", Layer.FLAG)], 100),
    ([("train.rounds", 7, Layer.FILE), ("train.duration", "5s", Layer.FLAG)], 7),
    ([("train.duration", "5s", Layer.FILE), ("train.rounds", 9, Layer.SET)], 9),
])
def test_rounds_are_cleared_only_when_a_layer_stops_by_time_or_accuracy_and_none_sets_rounds(
        layers: list[tuple[str, object, Layer]], rounds: int | None) -> None:
    resolved = resolve([Given(key, value, layer, f"by {key}") for key, value, layer in layers])
    assert resolved.config.train.rounds == rounds
    if rounds is None:
        origin = resolved.origin("train.rounds")
        assert origin.layer is layers[-1][2] and origin.source.startswith("cleared")


def _sample(key: Key) -> object:
    """A valid human value of `key` for TOML and --set (its default, or a made-up one)."""
    samples = {"akorun.run_id": "0" * 32, "akorun.secret": "ab" * 32}
    if key.dotted in samples:
        return samples[key.dotted]
    value = key.dump(key.default)
    return "none" if value is None else value


@pytest.mark.parametrize("key", KEYS, ids=lambda key: key.dotted)
def test_every_registry_key_is_read_from_toml_and_from_set(key: Key) -> None:
    value = _sample(key)
    from_file = resolve(layer_of({key.section: {key.name: value}}, Layer.FILE))
    assert from_file.origin(key.dotted).layer is Layer.FILE
    item = f"{key.dotted}={json.dumps(value)}"
    from_set = resolve(set_layer([item]))
    assert from_set.origin(key.dotted) == Origin(Layer.SET, f"by --set {item}")
    assert from_set.value(key.dotted) == from_file.value(key.dotted)
    assert key.field in {f.name for f in dataclasses.fields(SECTION_TYPES[key.section])}


def test_the_toml_mapping_is_the_registry() -> None:
    written = config_to_dict(RunConfig())
    assert {(s, k) for s, body in written.items() for k in body} == {
        (key.section, key.name) for key in KEYS if key.section in RUN_SECTIONS}


def test_generated_flags_are_the_registrys_and_default_to_none() -> None:
    parser = argparse.ArgumentParser()
    add_shared_arguments(parser, Tool.AKOSIM)
    flags = {option for action in parser._actions for option in action.option_strings}
    expected = {key.flag for key in KEYS if key.flag and Tool.AKOSIM in key.tools}
    assert expected <= flags
    assert "--peer-timeout" not in flags  # an akorun key: akosim does not take it
    assert all(getattr(parser.parse_args([]), key.name) is None
               for key in KEYS if key.flag and Tool.AKOSIM in key.tools)


def test_akosims_own_settings_are_registry_keys_checked_once_in_every_layer(tmp_path) -> None:
    """--compute, --message-overhead and --coalesce are [akosim] keys: a flag, --set or a
    file gives them, the schema checks them, and they are not part of the run."""
    from akocore.settings.layers import resolve
    from akocore.settings.normalise import ConfigError
    from akocore.settings.schema import AkosimConfig
    from akocore.settings.toml_io import file_layer, set_layer

    path = tmp_path / "sim.toml"
    path.write_text('[akosim]\ncompute = "300ms"\ncoalesce = 0.01\n')
    resolved = resolve([*file_layer(path), *set_layer(["akosim.message_overhead=2ms"])])
    assert resolved.akosim == AkosimConfig(compute=0.3, message_overhead_s=0.002,
                                           coalesce=0.01)
    assert resolved.config == RunConfig()  # the run is untouched
    assert AkosimConfig(compute=" Remeasure ").compute == "remeasure"
    for bad in ({"compute": "fast"}, {"coalesce": 0.7}, {"message_overhead_s": "-1ms"}):
        with pytest.raises(ConfigError):
            AkosimConfig(**bad)
    with pytest.raises(ConfigError, match="add a unit"):
        resolve(set_layer(["akosim.compute=300"]))
