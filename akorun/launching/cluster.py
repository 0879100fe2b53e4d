"""The cluster file: one TOML that every rank of a run reads, and rank resolution.

This module owns what makes a set of processes *one run*:

- the run config tables ``[cluster] [network] [exchange] [train]`` exactly as
  akocore.settings reads them (``cluster.hosts`` gives every rank's
  ``host:port``), and
- the ``[akorun]`` table (akocore.settings.schema.AkorunConfig, keys in the
  registry): ``run_id`` (uuid4 hex), ``secret`` (64 hex digits, from which
  every pair key derives; absent when `akorun init --per-rank-keys` wrote one
  key file per rank, ``keys``), ``allow`` (peer addresses let in),
  ``peer_timeout``, ``join_timeout``, ``checkpoint_every``, ``emulate``
  (shape sends in-process: auto = only on loopback), ``queue_messages`` and
  optional ``tls_cert`` / ``tls_key``.

A rank reads the file as the FILE layer of its settings (--set items and
flags go on top, akocore.settings.layers), so the file is only what was
chosen: `render_cluster_file` writes each value some layer set (and every
value that differs from the built-in default), and the built-in defaults as
comments, so that a rank started with ``--duration 40s`` stops by time unless
the file itself fixed the rounds. It writes by hand (simple TOML values, a
comment per key; no TOML-writer dependency) and `write_cluster_file` stores
it with mode 0600 because it holds the secret. `resolve_rank` finds this
process's rank from ``--rank``, ``AKORUN_RANK``, torchrun's
``RANK``/``WORLD_SIZE``, SLURM's ``SLURM_PROCID``/``SLURM_NTASKS`` or a
Kubernetes indexed Job's ``JOB_COMPLETION_INDEX``, in that order.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import ipaddress
import json
import math
import os
import secrets
import socket
import sys
import tomllib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from akocore.settings.cli_flags import flag_layer
from akocore.settings.key_registry import RUN_SECTIONS, current
from akocore.settings.layers import Given, Layer, ResolvedSettings, layer_of, resolve
from akocore.settings.normalise import EMULATE_MODES, ConfigError
from akocore.settings.schema import AkorunConfig, RunConfig
from akocore.settings.toml_io import file_layer, set_layer
from akorun.errors import UsageError
from akorun.runtime.endpoints import split_host
from akorun.transport.keys import RankKeys, read_rank_keys

__all__ = ["AKORUN_TABLE", "DEFAULT_BASE_PORT", "EMULATE_MODES", "AkorunSettings", "ClusterFile",
           "config_over", "hosts_from_text", "loopback_hosts", "new_settings",
           "read_cluster_file", "render_cluster_file", "resolve_rank", "settings_of",
           "should_emulate", "with_hosts", "write_cluster_file"]

AKORUN_TABLE = "akorun"
DEFAULT_BASE_PORT = 7070


@dataclass(frozen=True)
class AkorunSettings(AkorunConfig):
    """The ``[akorun]`` settings of a run that can start: a run_id, and a secret unless the
    cluster file was written for per-rank key files (each rank then names its own, `keys`)."""

    run_id: str = ""  # required: "" is refused below
    secret: str | None = ""  # None: no secret in the file (per-rank key files)

    def __post_init__(self) -> None:
        if self.run_id is None or not str(self.run_id).strip():
            raise ConfigError("akorun.run_id is missing; `akorun init` writes a complete "
                              "cluster file", "akorun.run_id")
        if self.secret is not None and not self.secret.strip():
            raise ConfigError("akorun.secret is missing; `akorun init` writes a complete "
                              "cluster file", "akorun.secret")
        super().__post_init__()

    @property
    def secret_bytes(self) -> bytes:
        if self.secret is None:
            raise UsageError("this cluster file holds no secret: give this rank its key file "
                             "(--keys FILE, written by `akorun init --per-rank-keys DIR`)")
        return bytes.fromhex(self.secret)

    def rank_keys(self, rank: int, world: int) -> RankKeys:
        """This rank's row of pair keys: from its key file (`keys`, ``{rank}`` replaced) when
        given, else derived from the secret. UsageError if the file does not fit this run."""
        if self.keys is None:
            return RankKeys.from_secret(self.secret_bytes, self.run_id_bytes, rank, world)
        path = self.keys.replace("{rank}", str(rank))
        warn_if_readable_by_others(path, "this rank's key file")
        try:
            keys = read_rank_keys(path)
        except ValueError as error:
            raise UsageError(str(error)) from None
        if keys.run_id != self.run_id_bytes:
            raise UsageError(f"{path}: written for run {keys.run_id.hex()}, the cluster file "
                             f"is run {self.run_id}; use the key files `akorun init` wrote "
                             f"with it")
        if (keys.rank, keys.world) != (rank, world):
            raise UsageError(f"{path}: key file of rank {keys.rank} of {keys.world}, this is "
                             f"rank {rank} of {world}")
        return keys

    @property
    def run_id_bytes(self) -> bytes:
        return uuid.UUID(self.run_id).bytes


def _fields(config: AkorunConfig) -> dict[str, Any]:
    return {item.name: getattr(config, item.name) for item in dataclasses.fields(config)}


def new_settings(base: AkorunConfig | None = None, **changes: Any) -> AkorunSettings:
    """Fresh run id and secret (uuid4, secrets.token_hex(32)) over `base` plus `changes`."""
    values = _fields(base if base is not None else AkorunConfig())
    values.update(changes)
    values.update(run_id=uuid.uuid4().hex, secret=secrets.token_hex(32))
    return AkorunSettings(**values)


def settings_of(resolved: ResolvedSettings, source: str) -> AkorunSettings:
    """The akorun settings of a resolved cluster file; ConfigError if it is not one.

    A cluster file without a secret (written with per-rank key files) reads as
    settings whose `secret` is None: the rank's `keys` file then holds its keys."""
    if not any(resolved.origin(f"{AKORUN_TABLE}.{name}").layer is Layer.FILE
               for name in ("run_id", "secret")):
        raise ConfigError(f"{source}: no [akorun] table (run_id, secret): this is a run config, "
                          f"not a cluster file; create one with `akorun init`")
    try:
        return AkorunSettings(**_fields(resolved.akorun))
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}", error.key) from None


@dataclass(frozen=True)
class ClusterFile:
    """A parsed cluster file: the run config, the akorun settings and the raw tables."""

    path: Path | None
    config: RunConfig
    settings: AkorunSettings
    tables: Mapping[str, Any]  # the run-config tables as read


# --------------------------------------------------------------------------- reading


def read_cluster_file(path: str | Path) -> ClusterFile:
    """Read a cluster file written by `akorun init` (or by hand); ConfigError on mistakes."""
    givens = file_layer(path)
    try:
        resolved = resolve([Given(g.key, g.value, g.layer) for g in givens])
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}", error.key) from None
    try:
        check_distinct_endpoints(resolved.config.cluster.hosts)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}", error.key) from None
    tables: dict[str, dict[str, Any]] = {}
    for given in givens:
        section, _, name = given.key.partition(".")
        if section != AKORUN_TABLE:
            tables.setdefault(section, {})[name] = given.value
    settings = settings_of(resolved, str(path))
    if settings.secret is not None:
        warn_if_readable_by_others(path, "the cluster file (it holds the run's secret)")
    return ClusterFile(Path(path), resolved.config, settings, tables)


_WARNED: set[str] = set()


def warn_if_readable_by_others(path: str | Path, what: str) -> bool:
    """One line on stderr (once per file) if `path`, a secret, may be read by other users
    (its group or everyone); True if it warned. A file that cannot be examined is left to
    whoever reads it next."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    if not mode & 0o044 or str(path) in _WARNED:
        return False
    _WARNED.add(str(path))
    sys.stderr.write(f"akorun: warning: {path}: {what} is readable by others (mode "
                     f"{mode & 0o777:04o}); `chmod 600 {path}`\n")
    return True


def config_over(base: RunConfig, tables: Mapping[str, Any], args: argparse.Namespace) -> RunConfig:
    """The --set items and flags of `args` over the run-config `tables` of a cluster file.

    The tables are the FILE layer (`base` is what they give alone, kept for the
    call's shape): a --duration or --target-accuracy flag clears rounds only
    when no layer, the file included, set rounds.
    """
    givens = [*layer_of(tables, Layer.FILE, "in the cluster file"),
              *set_layer(getattr(args, "set", None)), *flag_layer(args)]
    return resolve(givens, defaults=RunConfig()).config


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


def render_cluster_file(cfg: RunConfig, settings: AkorunSettings,
                        resolved: ResolvedSettings | None = None) -> str:
    """The cluster file's text: every key with a comment, each scheme's knobs in its own
    table ([exchange.diloco], ...), the [akorun] table last.

    With `resolved`, a key that no layer set and that still has its built-in
    default is written as a comment (so a rank's own flags can still move it,
    e.g. a --duration clears the default rounds); without it every key is a value.
    """
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# akorun cluster file, written by `akorun init` on {stamp}.",
        "# Every rank of the run reads this same file: copy it to each host unchanged.",
        *(["# It holds the run's shared secret: keep it private (file mode 0600).",
           "# Start rank R with:  akorun worker --rank R --config THIS_FILE"]
          if settings.secret is not None else
          ["# It holds no secret: each host also needs its own rank's key file.",
           "# Start rank R with:  akorun worker --rank R --config THIS_FILE --keys rank-R.keys"]),
        "# Keys written as comments keep their built-in default.",
    ]
    for section in (*RUN_SECTIONS, AKORUN_TABLE):  # the run and akorun's own settings
        keys = list(current().sections[section].values())
        holder = settings if section == AKORUN_TABLE else getattr(cfg, section)
        tables = [None, *dict.fromkeys(key.table for key in keys if key.table)]
        for table in tables:  # [exchange], then each scheme's [exchange.<table>]
            lines.append("")
            lines.append(f"[{section}]" if table is None else f"[{section}.{table}]")
            for key in (key for key in keys if key.table == table):
                value = key.value_in(holder)
                lines.append(f"# {key.comment}")
                text = f"{key.name} = {_toml_value(key.dump(value))}"
                chosen = resolved is None or resolved.given(key.dotted) or value != key.default
                lines.append(text if chosen else f"# {text}")
    return "\n".join(lines) + "\n"


def write_cluster_file(path: str | Path, cfg: RunConfig, settings: AkorunSettings, *,
                       force: bool = True, resolved: ResolvedSettings | None = None) -> Path:
    """Write the cluster file atomically with mode 0600; UsageError if it exists and not force."""
    target = Path(path)
    if target.exists() and not force:
        raise UsageError(f"{target} exists; pass --force to overwrite it")
    text = render_cluster_file(cfg, settings, resolved)
    # the written file must read back as the same run
    reread = resolve(layer_of(tomllib.loads(text), Layer.FILE))
    if reread.config != cfg or reread.akorun != AkorunConfig(**_fields(settings)):
        raise AssertionError("cluster file does not read back as the same run")
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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def should_emulate(settings: AkorunConfig, cfg: RunConfig,
                   override: bool | None = None) -> bool:
    """Shape sends in-process? `override` wins, then [akorun].emulate (auto = all loopback)."""
    if override is not None:
        return override
    if settings.emulate != "auto":
        return settings.emulate == "on"
    return all(is_loopback(split_host(entry)[0]) for entry in cfg.cluster.hosts)


def endpoint_key(entry: str) -> tuple[str, int]:
    """One spelling per endpoint: ``localhost:P`` and ``127.0.0.1:P`` are the same socket."""
    host, port = split_host(entry)
    host = host.lower()
    if host == "localhost":
        host = "127.0.0.1"
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        pass
    return host, port


def check_distinct_endpoints(hosts: tuple[str, ...]) -> None:
    """ConfigError (key cluster.hosts) when two ranks name one endpoint, however spelled."""
    seen: dict[tuple[str, int], int] = {}
    for rank, entry in enumerate(hosts):
        try:
            key = endpoint_key(entry)
        except ValueError:
            continue  # the config's own checks name a malformed entry
        if key in seen:
            raise ConfigError(f"cluster.hosts: ranks {seen[key]} and {rank} both listen on "
                              f"{key[0]}:{key[1]} ({hosts[seen[key]]!r}, {entry!r}); give each "
                              f"rank its own port", "cluster.hosts")
        seen[key] = rank


def with_hosts(cfg: RunConfig, hosts: tuple[str, ...]) -> RunConfig:
    check_distinct_endpoints(hosts)
    return replace(cfg, cluster=replace(cfg.cluster, hosts=hosts))


# --------------------------------------------------------------------------- ranks


def _env_int(env: Mapping[str, str], name: str) -> int:
    text = env[name]
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{name}={text!r}: expected a whole number") from None


def resolve_rank(flag_rank: int | None, env: Mapping[str, str], world: int) -> int:
    """This process's rank of `world`: --rank, AKORUN_RANK, RANK, SLURM_PROCID,
    JOB_COMPLETION_INDEX in that order (`requested_rank`); UsageError when none is given."""
    rank = requested_rank(flag_rank, env, world)
    if rank is None:
        raise UsageError(f"no rank given: pass --rank R (0..{world - 1}), or set AKORUN_RANK, "
                         f"RANK/WORLD_SIZE (torchrun), run under srun or as a Kubernetes "
                         f"indexed Job, or meet the others with --rendezvous HOST:PORT")
    return rank


RANK_SOURCES = (("AKORUN_RANK", "AKORUN_RANK", "AKORUN_WORLD_SIZE"),
                ("RANK", "RANK (torchrun)", "WORLD_SIZE"),
                ("SLURM_PROCID", "SLURM_PROCID", "SLURM_NTASKS"),
                ("JOB_COMPLETION_INDEX", "JOB_COMPLETION_INDEX (Kubernetes)", None))


def requested_rank(flag_rank: int | None, env: Mapping[str, str], world: int) -> int | None:
    """The rank --rank or a rank variable gives this process (AKORUN_RANK, RANK,
    SLURM_PROCID, JOB_COMPLETION_INDEX in that order), None if none does; RANK and
    SLURM_PROCID that disagree (with neither of the first two given) are refused.

    A world size given by the environment (AKORUN_WORLD_SIZE, WORLD_SIZE,
    SLURM_NTASKS) must equal the cluster file's `world`.
    """
    if flag_rank is None and "AKORUN_RANK" not in env:
        given = {name: env[name].strip() for name in ("RANK", "SLURM_PROCID") if name in env}
        if len(set(given.values())) > 1:
            said = " and ".join(f"{name}={value}" for name, value in given.items())
            raise UsageError(f"conflicting rank variables: {said}; pass --rank R or set "
                             f"AKORUN_RANK to say which rank this process is")
    size_name: str | None = None
    if flag_rank is not None:
        rank, source = flag_rank, "--rank"
    else:
        found = next(((n, s, z) for n, s, z in RANK_SOURCES if n in env), None)
        if found is None:
            return None
        rank, source, size_name = _env_int(env, found[0]), found[1], found[2]
    if size_name is not None and size_name in env:
        size = _env_int(env, size_name)
        if size != world:
            raise UsageError(f"{size_name}={size} disagrees with the cluster file's "
                             f"{world} ranks (cluster.workers)")
    if not 0 <= rank < world:
        raise UsageError(f"{source} {rank} is out of range: the cluster file has {world} ranks "
                         f"(0..{world - 1})")
    return rank
