"""The cluster file: one TOML that every rank of a run reads, and rank resolution.

This module owns what makes a set of processes *one run*:

- the run config tables ``[cluster] [network] [exchange] [train]`` exactly as
  akocore.config reads them (``cluster.hosts`` gives every rank's
  ``host:port``), and
- an ``[akorun]`` table that akocore never sees: ``run_id`` (uuid4 hex),
  ``secret`` (64 hex digits, the HMAC key of every message), ``peer_timeout``,
  ``checkpoint_every``, ``emulate`` (shape sends in-process: auto = only on
  loopback) and optional ``tls_cert`` / ``tls_key``.

`render_cluster_file` writes it by hand (simple TOML values, a comment per
key; no TOML-writer dependency) and `write_cluster_file` stores it with mode
0600 because it holds the secret. `resolve_rank` finds this process's rank
from ``--rank``, ``AKORUN_RANK``, torchrun's ``RANK``/``WORLD_SIZE`` or
SLURM's ``SLURM_PROCID``/``SLURM_NTASKS``, in that order.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import ipaddress
import json
import math
import os
import secrets
import socket
import tomllib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from akocore.config import (
    ConfigError,
    RunConfig,
    config_from_args,
    config_from_dict,
    config_to_dict,
    read_toml,
    replace_in,
)
from akocore.units import UnitError, duration_exact_text, parse_duration
from akorun.errors import UsageError

AKORUN_TABLE = "akorun"
EMULATE_MODES = ("auto", "on", "off")
DEFAULT_PEER_TIMEOUT_S = 10.0
DEFAULT_BASE_PORT = 7070
SECRET_MIN_BYTES = 16

_AKORUN_KEYS = ("run_id", "secret", "peer_timeout", "checkpoint_every", "emulate", "tls_cert",
                "tls_key")

_KEY_COMMENTS: dict[str, dict[str, str]] = {
    "cluster": {
        "workers": "number of ranks (for scheme ps: training workers + parameter servers)",
        "hosts": '"host:port" each rank listens on, rank 0 first',
    },
    "network": {
        "bandwidth": "each node's NIC (uplink = downlink); a list goes round robin",
        "link_bandwidth": "per-pair cap for pairs (0,1),(0,2),...,(1,2),...; [] = no cap",
        "latency": "one-way latency per message for the pairs as above",
        "link_bandwidth_matrix": 'n x n per ordered pair (row sends); "none" = use the lists',
        "latency_matrix": 'n x n per ordered pair; "none" = use the list',
    },
    "exchange": {
        "scheme": "ako (partial all-to-all) | ps (parameter servers) | allreduce (ring)",
        "p": "partitions per gradient: auto | auto-per-worker | N | [N0, N1, ...]",
        "ssp": 'staleness bound in rounds; 0 = lockstep, "inf" = fully asynchronous',
        "schedule": "staggered: worker i sends partition (t + i) mod p; aligned: t mod p",
        "reduce": "mean (1/n of the summed gradients) | sum (as TF.AKO)",
        "utilisation": "p auto: target fraction of the uplink, 0 < u <= 1",
        "p_max": "p auto: largest p allowed",
        "ps_servers": "scheme ps: number of parameter-server ranks (the last ranks)",
        "ps_mode": "scheme ps: sync | async",
        "push_every": "scheme ps async: push every N rounds",
        "fetch_every": "scheme ps async: fetch parameters every N rounds",
    },
    "train": {
        "workload": "model and dataset, e.g. digits-mlp",
        "optimizer": "sgd | momentum | adam",
        "lr": "learning rate per update",
        "batch_size": "examples per worker per round",
        "seed": "seed of the initial parameters and the data order (same on every rank)",
        "rounds": 'rounds per worker; "none" = stop by duration or accuracy',
        "duration": 'wall time of training, e.g. "300s"; "none" = no time limit',
        "target_accuracy": 'stop once a replica reaches this test accuracy; "none" = never',
        "eval_every": "evaluate the local replica every N rounds",
        "data_path": 'dataset file for cifar10/mnist workloads; "none" = not needed',
    },
    AKORUN_TABLE: {
        "run_id": "this run's id (uuid4 hex); every message carries it",
        "secret": "HMAC-SHA256 key of every message (keep private: this file is mode 0600)",
        "peer_timeout": "a peer silent this long leaves the SSP gate until it speaks again",
        "checkpoint_every": "write a checkpoint every N rounds (0 = only the final one)",
        "emulate": "shape sends in-process to [network]: auto (loopback only) | on | off",
        "tls_cert": 'PEM certificate each rank serves with; "" = plain HTTP',
        "tls_key": 'PEM private key of tls_cert; "" = plain HTTP',
    },
}


@dataclass(frozen=True)
class AkorunSettings:
    """The ``[akorun]`` table: what akorun needs beyond the run config."""

    run_id: str
    secret: str  # hex
    peer_timeout_s: float = DEFAULT_PEER_TIMEOUT_S
    checkpoint_every: int = 0
    emulate: str = "auto"
    tls_cert: str | None = None
    tls_key: str | None = None

    def __post_init__(self) -> None:
        try:
            uuid.UUID(self.run_id)
        except (ValueError, AttributeError, TypeError):
            raise ConfigError(f"akorun.run_id: got {self.run_id!r}, expected a uuid such as "
                              f"{uuid.uuid4().hex!r}", "akorun.run_id") from None
        try:
            raw = bytes.fromhex(self.secret)
        except (ValueError, TypeError):
            raw = b""
        if len(raw) < SECRET_MIN_BYTES:
            raise ConfigError(f"akorun.secret: expected at least {2 * SECRET_MIN_BYTES} hex "
                              f"digits (akorun init writes 64)", "akorun.secret")
        if not (self.peer_timeout_s > 0 and math.isfinite(self.peer_timeout_s)):
            raise ConfigError(f"akorun.peer_timeout: got {self.peer_timeout_s}, expected a "
                              f'duration > 0 such as "10s"', "akorun.peer_timeout")
        if isinstance(self.checkpoint_every, bool) or not isinstance(self.checkpoint_every, int) \
                or self.checkpoint_every < 0:
            raise ConfigError(f"akorun.checkpoint_every: got {self.checkpoint_every!r}, expected "
                              f"a whole number of rounds >= 0", "akorun.checkpoint_every")
        if self.emulate not in EMULATE_MODES:
            raise ConfigError(f"akorun.emulate: got {self.emulate!r}, expected one of "
                              f"{', '.join(EMULATE_MODES)}", "akorun.emulate")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("akorun.tls_cert and akorun.tls_key: give both or neither",
                              "akorun.tls_cert")

    @property
    def secret_bytes(self) -> bytes:
        return bytes.fromhex(self.secret)

    @property
    def run_id_bytes(self) -> bytes:
        return uuid.UUID(self.run_id).bytes


def new_settings(**changes: Any) -> AkorunSettings:
    """Fresh run id and secret (uuid4, secrets.token_hex(32)) plus `changes`."""
    return AkorunSettings(run_id=uuid.uuid4().hex, secret=secrets.token_hex(32), **changes)


@dataclass(frozen=True)
class ClusterFile:
    """A parsed cluster file: the run config, the akorun settings and the raw tables."""

    path: Path | None
    config: RunConfig
    settings: AkorunSettings
    tables: Mapping[str, Any]  # the run-config tables as read (for flag layering)


# --------------------------------------------------------------------------- reading


def _unset(value: object) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in ("", "none"))


def settings_from_table(table: object, source: str) -> AkorunSettings:
    """The ``[akorun]`` table -> AkorunSettings; ConfigError naming the key."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{source}: [akorun] must be a table with keys "
                          f"{', '.join(_AKORUN_KEYS)}", AKORUN_TABLE)
    for key in table:
        if key not in _AKORUN_KEYS:
            raise ConfigError(f"{source}: akorun.{key}: unknown key; known keys in [akorun]: "
                              f"{', '.join(_AKORUN_KEYS)}", f"akorun.{key}")
    for key in ("run_id", "secret"):
        if _unset(table.get(key)):
            raise ConfigError(f"{source}: akorun.{key} is missing; `akorun init` writes a "
                              f"complete cluster file", f"akorun.{key}")
    changes: dict[str, Any] = {"run_id": str(table["run_id"]), "secret": str(table["secret"])}
    if "peer_timeout" in table:
        try:
            changes["peer_timeout_s"] = parse_duration(table["peer_timeout"])
        except UnitError as error:
            raise ConfigError(f"{source}: akorun.peer_timeout: {error}",
                              "akorun.peer_timeout") from None
    if "checkpoint_every" in table:
        changes["checkpoint_every"] = table["checkpoint_every"]
    if "emulate" in table:
        changes["emulate"] = table["emulate"]
    for key in ("tls_cert", "tls_key"):
        if key in table and not _unset(table[key]):
            changes[key] = str(table[key])
    try:
        return AkorunSettings(**changes)
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}", error.key) from None


def read_cluster_file(path: str | Path) -> ClusterFile:
    """Read a cluster file written by `akorun init` (or by hand); ConfigError on mistakes."""
    tables = read_toml(path)
    if AKORUN_TABLE not in tables:
        raise ConfigError(f"{path}: no [akorun] table (run_id, secret): this is a run config, "
                          f"not a cluster file; create one with `akorun init`")
    settings = settings_from_table(tables.pop(AKORUN_TABLE), str(path))
    try:
        config = config_from_dict(tables)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}", error.key) from None
    return ClusterFile(Path(path), config, settings, tables)


def _without_config(args: argparse.Namespace) -> argparse.Namespace:
    clone = copy.copy(args)
    clone.config = None
    return clone


def config_over(base: RunConfig, tables: Mapping[str, Any], args: argparse.Namespace) -> RunConfig:
    """The shared flags and --set items of `args` on top of a config read from a file.

    Same precedence as akocore.config.config_from_args (file < --set < flags),
    including its rounds rule: a --duration or --target-accuracy flag clears
    rounds only when no layer (the file included) set rounds.
    """
    cfg = config_from_args(_without_config(args), defaults=base)
    file_rounds = not _unset(tables.get("train", {}).get("rounds"))
    set_rounds = any(item.strip().startswith("train.rounds") for item in (args.set or []))
    if (cfg.train.rounds is None and base.train.rounds is not None and file_rounds
            and getattr(args, "rounds", None) is None and not set_rounds):
        cfg = replace_in(cfg, "train.rounds", base.train.rounds)
    return cfg


def run_config_from_args(args: argparse.Namespace) -> tuple[RunConfig, AkorunSettings | None]:
    """The run config of `--config` (a plain run config or a cluster file) and the flags.

    Returns the akorun settings too when `--config` is a cluster file.
    """
    path = getattr(args, "config", None)
    if path is None:
        return config_from_args(args), None
    tables = read_toml(path)
    if AKORUN_TABLE not in tables:
        return config_from_args(args), None
    settings = settings_from_table(tables.pop(AKORUN_TABLE), str(path))
    try:
        base = config_from_dict(tables)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}", error.key) from None
    return config_over(base, tables, args), settings


# --------------------------------------------------------------------------- writing


def _toml_value(value: Any) -> str:
    if value is None:
        return '"none"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return '"inf"'
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=True)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} to TOML")


def _settings_table(settings: AkorunSettings) -> dict[str, Any]:
    return {
        "run_id": settings.run_id,
        "secret": settings.secret,
        "peer_timeout": duration_exact_text(settings.peer_timeout_s),
        "checkpoint_every": settings.checkpoint_every,
        "emulate": settings.emulate,
        "tls_cert": settings.tls_cert or "",
        "tls_key": settings.tls_key or "",
    }


def render_cluster_file(cfg: RunConfig, settings: AkorunSettings) -> str:
    """The cluster file's text: every run-config key, the [akorun] table, a comment per key."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# akorun cluster file, written by `akorun init` on {stamp}.",
        "# Every rank of the run reads this same file: copy it to each host unchanged.",
        "# It holds the run's shared secret: keep it private (file mode 0600).",
        "# Start rank R with:  akorun worker --rank R --config THIS_FILE",
    ]
    tables: dict[str, dict[str, Any]] = dict(config_to_dict(cfg))
    tables[AKORUN_TABLE] = _settings_table(settings)
    for name, body in tables.items():
        lines.append("")
        lines.append(f"[{name}]")
        for key, value in body.items():
            comment = _KEY_COMMENTS.get(name, {}).get(key)
            if comment:
                lines.append(f"# {comment}")
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def write_cluster_file(path: str | Path, cfg: RunConfig, settings: AkorunSettings, *,
                       force: bool = True) -> Path:
    """Write the cluster file atomically with mode 0600; UsageError if it exists and not force."""
    target = Path(path)
    if target.exists() and not force:
        raise UsageError(f"{target} exists; pass --force to overwrite it")
    text = render_cluster_file(cfg, settings)
    # the written file must read back as the same run
    parsed = tomllib.loads(text)
    settings_from_table(parsed.pop(AKORUN_TABLE), str(target))
    if config_from_dict(parsed) != cfg:
        raise AssertionError("cluster file does not read back as the same config")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


# --------------------------------------------------------------------------- hosts


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free on `host` right now (the OS picks them)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def loopback_hosts(count: int) -> tuple[str, ...]:
    return tuple(f"127.0.0.1:{port}" for port in free_ports(count))


def hosts_from_text(text: str, count: int, base_port: int = DEFAULT_BASE_PORT) -> tuple[str, ...]:
    """``a,b,c`` or ``a:7000,b:7000`` -> one ``host:port`` per rank.

    Hosts without a port get `base_port`, plus one for each earlier rank on
    the same host. One host for several ranks is allowed (``a,a,a``).
    """
    items = [item.strip() for item in text.split(",") if item.strip()]
    if len(items) != count:
        raise UsageError(f"--hosts: got {len(items)} hosts, expected one per rank "
                         f"(--workers {count})")
    used: dict[str, int] = {}
    hosts = []
    for item in items:
        host, sep, port = item.rpartition(":")
        if sep and port.isdigit() and not host.endswith(":"):
            hosts.append(item)
            continue
        used[item] = used.get(item, -1) + 1
        hosts.append(f"{item}:{base_port + used[item]}")
    return tuple(hosts)


def split_host(entry: str) -> tuple[str, int]:
    """``host:port`` / ``[v6]:port`` -> (host, port)."""
    host, _, port = entry.rpartition(":")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def should_emulate(settings: AkorunSettings, cfg: RunConfig, override: bool | None) -> bool:
    """Shape sends in-process? The flag wins, then [akorun].emulate (auto = all loopback)."""
    if override is not None:
        return override
    if settings.emulate != "auto":
        return settings.emulate == "on"
    return all(is_loopback(split_host(entry)[0]) for entry in cfg.cluster.hosts)


def with_hosts(cfg: RunConfig, hosts: tuple[str, ...]) -> RunConfig:
    return replace(cfg, cluster=replace(cfg.cluster, hosts=hosts))


# --------------------------------------------------------------------------- ranks


def _env_int(env: Mapping[str, str], name: str) -> int:
    text = env[name]
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{name}={text!r}: expected a whole number") from None


def resolve_rank(flag_rank: int | None, env: Mapping[str, str], world: int) -> int:
    """This process's rank of `world`: --rank, AKORUN_RANK, RANK, SLURM_PROCID in that order.

    A world size given by the environment (AKORUN_WORLD_SIZE, WORLD_SIZE,
    SLURM_NTASKS) must equal the cluster file's `world`.
    """
    size_name: str | None
    if flag_rank is not None:
        rank, source, size_name = flag_rank, "--rank", None
    elif "AKORUN_RANK" in env:
        rank, source, size_name = _env_int(env, "AKORUN_RANK"), "AKORUN_RANK", \
            "AKORUN_WORLD_SIZE"
    elif "RANK" in env:
        rank, source, size_name = _env_int(env, "RANK"), "RANK (torchrun)", "WORLD_SIZE"
    elif "SLURM_PROCID" in env:
        rank, source, size_name = _env_int(env, "SLURM_PROCID"), "SLURM_PROCID", "SLURM_NTASKS"
    else:
        raise UsageError(f"no rank given: pass --rank R (0..{world - 1}), or set AKORUN_RANK, "
                         f"RANK/WORLD_SIZE (torchrun) or run under srun")
    if size_name is not None and size_name in env:
        size = _env_int(env, size_name)
        if size != world:
            raise UsageError(f"{size_name}={size} disagrees with the cluster file's "
                             f"{world} ranks (cluster.workers)")
    if not 0 <= rank < world:
        raise UsageError(f"{source} {rank} is out of range: the cluster file has {world} ranks "
                         f"(0..{world - 1})")
    return rank
