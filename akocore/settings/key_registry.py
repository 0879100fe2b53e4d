"""The key registry: every setting once, with everything the edges need to know.

One `Key` per setting: its section and TOML name, the dataclass field it
fills, how its typed value is written back as a human value (``dump``), a
one-line comment (cluster files), and, when a command line takes it, the
flag, its help text and which commands (`Tool`) offer it. The TOML mapping,
the ``--set`` keys, the argparse flags of akosim and akorun, the cluster
file's comments and ``--show-config`` are all generated from `KEYS`.

Built-in defaults are NOT written here: each is the field default of its
section's dataclass in akocore.settings.schema, and `Key.default` reads it.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from akocore.schemes.diloco_sync import OUTER_SYNCS
from akocore.schemes.named import SCHEME_NAMES
from akocore.settings.normalise import (
    EMULATE_MODES,
    NETWORK_LAYERS,
    NETWORK_MODELS,
    OPTIMIZERS,
    SCHEDULES,
    matrix_to_text,
)
from akocore.settings.schema import (
    PLATFORMS,
    AkorunConfig,
    AkosimConfig,
    ClusterConfig,
    ExchangeConfig,
    NetworkConfig,
    TrainConfig,
)
from akocore.units import bandwidth_exact_text, duration_exact_text


class Tool(enum.Enum):
    """A command that takes flags generated from the registry."""

    AKOSIM = "akosim"  # plan, train, sweep and predict: the run settings
    AKOSIM_PLAN = "akosim plan / train"  # the [akosim] settings, among plan's own flags
    AKORUN_INIT = "akorun init"
    AKORUN_RANK = "akorun worker / ps"
    AKORUN_LAUNCH = "akorun launch"


class FlagKind(enum.Enum):
    VALUE = "value"  # read like a TOML value: "4" -> 4, "inf" -> inf, "40mbps" stays text
    TEXT = "text"  # kept as given (names, paths)
    SWITCH = "switch"  # --NAME [MODE] / --no-NAME: a mode, on or off


EVERY_TOOL = frozenset(Tool)
AKORUN_TOOLS = frozenset({Tool.AKORUN_INIT, Tool.AKORUN_RANK, Tool.AKORUN_LAUNCH})

# section name -> the dataclass that holds it; RUN_SECTIONS make up a RunConfig
SECTION_TYPES: dict[str, type] = {
    "cluster": ClusterConfig,
    "network": NetworkConfig,
    "exchange": ExchangeConfig,
    "train": TrainConfig,
    "akorun": AkorunConfig,
    "akosim": AkosimConfig,
}
RUN_SECTIONS = ("cluster", "network", "exchange", "train")
SHELL_SECTIONS = ("akorun", "akosim")  # one shell's settings: not part of the run or its hash


def _plain(value: Any) -> Any:
    return value


def _bandwidth_list(values: tuple[float, ...]) -> list[str]:
    return [bandwidth_exact_text(value) for value in values]


def _duration_list(values: tuple[float, ...]) -> list[str]:
    return [duration_exact_text(value) for value in values]


def _optional_duration(value: float | None) -> str | None:
    return None if value is None else duration_exact_text(value)


def _dump_compute(value: float | str) -> str:
    return value if isinstance(value, str) else duration_exact_text(value)


def _dump_p(value: str | tuple[int, ...]) -> Any:
    return value if isinstance(value, str) else list(value)


def _dump_ssp(value: float) -> Any:
    return "inf" if math.isinf(value) else int(value)


@dataclass(frozen=True)
class Key:
    """One setting: where it lives, how it is written, and which flag sets it."""

    section: str
    name: str  # TOML key, --set key and argparse dest
    field: str  # dataclass field in SI units
    comment: str  # one line: what the value means
    dump: Callable[[Any], Any] = _plain  # typed value -> human (TOML/JSON) value
    flag: str | None = None
    flag_help: str = ""
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    tools: frozenset[Tool] = frozenset()
    kind: FlagKind = FlagKind.VALUE
    unit: str = ""  # a unit example ("mbps"): a bare number is refused from every layer

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def default(self) -> Any:
        """The built-in default (typed), read from the section dataclass."""
        for item in dataclasses.fields(SECTION_TYPES[self.section]):
            if item.name == self.field:
                if item.default is not dataclasses.MISSING:
                    return item.default
                return item.default_factory()  # type: ignore[misc,operator]
        raise LookupError(f"{self.dotted}: no field {self.field}")


def _run(section: str, name: str, field: str, comment: str, **more: Any) -> Key:
    """A run setting; with a flag, every command takes it."""
    if "flag" in more:
        more.setdefault("tools", EVERY_TOOL)
    return Key(section, name, field, comment, **more)


_DILOCO_TOOLS = frozenset({Tool.AKOSIM, Tool.AKORUN_INIT, Tool.AKORUN_LAUNCH})

KEYS: tuple[Key, ...] = (
    # ------------------------------------------------------------------ cluster
    _run("cluster", "workers", "workers",
         "number of ranks (for scheme ps: training workers + parameter servers)",
         flag="--workers", metavar="N", flag_help="number of worker nodes (>= 2), e.g. 8"),
    _run("cluster", "hosts", "hosts", '"host:port" each rank listens on, rank 0 first',
         dump=list),
    # ------------------------------------------------------------------ network
    _run("network", "bandwidth", "bandwidth_bps",
         "each node's NIC (uplink = downlink); a list goes round robin",
         dump=_bandwidth_list, flag="--bandwidth", metavar="RATE[,RATE...]", unit="mbps",
         flag_help="each node's NIC (uplink and downlink) with its unit, e.g. 40mbps, 1gbps, "
                   "800Mbit/s, 10MB/s (b = bits, B = bytes; a bare number is refused); a "
                   "list is assigned to nodes in turn"),
    _run("network", "link_bandwidth", "link_bandwidth_bps",
         "per-pair cap for pairs (0,1),(0,2),...,(1,2),...; [] = no cap",
         dump=_bandwidth_list, flag="--link-bandwidth", metavar="RATE[,RATE...]", unit="mbps",
         flag_help="per-pair link cap with its unit, e.g. 40,20,10mbps (a bare number is "
                   "refused); a list is assigned to pairs (0,1),(0,2),...,(1,2),... in turn; "
                   "none = no cap"),
    _run("network", "latency", "latency_s", "one-way latency per message for the pairs as above",
         dump=_duration_list, flag="--latency", metavar="DURATION[,DURATION...]", unit="ms",
         flag_help="per-message latency of each link with its unit, e.g. 5ms or 100us (a "
                   "bare number is refused); a list is assigned to pairs (0,1),(0,2),... "
                   "in turn"),
    _run("network", "link_bandwidth_matrix", "link_bandwidth_matrix_bps",
         'n x n per ordered pair (row sends); "none" = use the lists',
         dump=lambda m: matrix_to_text(m, bandwidth_exact_text), unit="mbps"),
    _run("network", "latency_matrix", "latency_matrix_s",
         'n x n per ordered pair; "none" = use the list',
         dump=lambda m: matrix_to_text(m, duration_exact_text), unit="ms"),
    _run("network", "model", "model",
         "akosim: maxmin (pure max-min fluid) | tcp (TCP-aware: goodput, window/RTT, "
         "slow start, per-message software cost, one message per connection, first come "
         "first sent) | layers joined by '+' from " + " ".join(NETWORK_LAYERS),
         flag="--network-model", metavar="MODEL", tools=frozenset({Tool.AKOSIM}),
         flag_help="how akosim shares the network: " + " or ".join(NETWORK_MODELS)
                   + " (maxmin: the fluid ideal, what akorun's in-process emulation does; "
                   "default for plan and train; tcp: TCP-aware, host-calibrated; default "
                   "for akosim predict), or a stack of layers joined by '+', e.g. "
                   "tcp-core+slow-start+one-per-connection (tcp without first come, first "
                   "sent); layers: " + ", ".join(NETWORK_LAYERS)),
    # ------------------------------------------------------------------ exchange
    _run("exchange", "scheme", "scheme",
         "ako (partial all-to-all) | ps (parameter servers) | allreduce (ring) | wagma "
         "(group model averaging) | diloco | streaming-diloco (local steps, outer step on "
         "averaged pseudo-gradients), or a named scheme: easgd hogwild downpour adag sdag "
         "sync-sgd sync-sgd-lr-per-worker (settings of ps; see the guide's Exchange schemes)",
         flag="--scheme", choices=SCHEME_NAMES,
         flag_help="exchange: ako (partial all-to-all), ps (parameter servers), allreduce "
                   "(ring), wagma (group model averaging), diloco, streaming-diloco (H local "
                   "steps, then averaged pseudo-gradients), or a named scheme that stands for "
                   "its ps settings: easgd, hogwild, downpour, adag, sdag, sync-sgd, "
                   "sync-sgd-lr-per-worker (as configs/presets/NAME.toml)"),
    _run("exchange", "p", "p",
         "partitions per gradient: auto | auto-per-worker | N | [N0, N1, ...]",
         dump=_dump_p, flag="--p", metavar="{auto,auto-per-worker,N,N1,N2,...}",
         flag_help="partitions per gradient (each round sends 1/p of it): auto, "
                   "auto-per-worker, one number for all workers or one per worker, "
                   "e.g. 4 or 4,2,1,1"),
    _run("exchange", "ssp", "ssp",
         'staleness bound in rounds; 0 = lockstep, "inf" = fully asynchronous',
         dump=_dump_ssp, flag="--ssp", metavar="{N,inf}",
         flag_help="staleness bound in rounds (0 = lockstep, inf = fully asynchronous), e.g. 2"),
    _run("exchange", "schedule", "schedule",
         "staggered: worker i sends partition (t + i) mod p; aligned: t mod p",
         flag="--schedule", choices=SCHEDULES,
         flag_help="which partition a worker sends in round t: staggered (t+i mod p) or "
                   "aligned (t mod p)"),
    _run("exchange", "flush", "flush",
         "scheme ako: what every replica applies of the gradients still owed at the end: "
         "average (ends at the mean of the replicas), full (all of it: the exact sum) or a "
         "fraction 0 < w <= 1",
         flag="--flush", metavar="{average,full,FRACTION}",
         flag_help="scheme ako: what every replica applies of the gradients still owed at "
                   "the end: average (the mean of the replicas; default), full (every "
                   "gradient in full) or a fraction, e.g. 0.5"),
    _run("exchange", "reduce", "reduce", "mean (1/n of the summed gradients) | sum (as TF.AKO)"),
    _run("exchange", "utilisation", "utilisation",
         "p auto: target fraction of the uplink, 0 < u <= 1"),
    _run("exchange", "p_max", "p_max", "p auto: largest p allowed"),
    _run("exchange", "ps_servers", "ps_servers",
         "scheme ps: number of parameter-server ranks (the last ranks)"),
    _run("exchange", "ps_mode", "ps_mode", "scheme ps: sync | async"),
    _run("exchange", "push_every", "push_every", "scheme ps async: push every N rounds"),
    _run("exchange", "fetch_every", "fetch_every",
         "scheme ps async: fetch parameters every N rounds"),
    _run("exchange", "group_size", "group_size",
         "scheme wagma: G, workers per butterfly group (model averaging each round)",
         flag="--group-size", metavar="G", tools=frozenset({Tool.AKOSIM, Tool.AKORUN_INIT,
                                                           Tool.AKORUN_LAUNCH}),
         flag_help="scheme wagma: workers per averaging group, e.g. 4"),
    _run("exchange", "global_every", "global_every",
         "scheme wagma: tau, a global model average every tau rounds (staleness <= tau - 1)",
         flag="--global-every", metavar="TAU", tools=frozenset({Tool.AKOSIM, Tool.AKORUN_INIT,
                                                               Tool.AKORUN_LAUNCH}),
         flag_help="scheme wagma: a global model average every TAU rounds, e.g. 10"),
    _run("exchange", "elastic_alpha", "elastic_alpha",
         "scheme ps elastic: moving rate alpha = lr * rho, 0 < alpha < 1; 0 = 0.9 / workers"),
    _run("exchange", "local_steps", "local_steps",
         "scheme ps: workers apply their optimizer locally and push the updates "
         "(async: DOWNPOUR, ADAG; sync: SDAG, SAGN)"),
    _run("exchange", "push_average", "push_average",
         "scheme ps with local_steps: push the update divided by push_every (ADAG, SAGN)"),
    _run("exchange", "worker_lr_scale", "worker_lr_scale",
         "scheme ps: learning-rate factor per training worker, in turn; [] = all 1", dump=list),
    _run("exchange", "inner_steps", "inner_steps",
         "scheme diloco, streaming-diloco: H, inner optimizer steps (rounds) between two "
         "syncs of the model (of each fragment)",
         flag="--inner-steps", metavar="H",
         tools=_DILOCO_TOOLS,
         flag_help="scheme diloco, streaming-diloco: inner optimizer steps between syncs, "
                   "e.g. 10"),
    _run("exchange", "outer_lr", "outer_lr",
         "scheme diloco, streaming-diloco: the outer optimizer's learning rate",
         flag="--outer-lr", metavar="LR",
         tools=_DILOCO_TOOLS,
         flag_help="scheme diloco, streaming-diloco: outer learning rate, e.g. 0.7"),
    _run("exchange", "outer_momentum", "outer_momentum",
         "scheme diloco, streaming-diloco: the outer optimizer's Nesterov momentum "
         "(0 = plain SGD)",
         flag="--outer-momentum", metavar="M",
         tools=_DILOCO_TOOLS,
         flag_help="scheme diloco, streaming-diloco: outer Nesterov momentum, e.g. 0.9"),
    _run("exchange", "outer_sync", "outer_sync",
         "scheme diloco, streaming-diloco: how the pseudo-gradients are averaged: allreduce "
         "(reduce-scatter to chunk owners, then all-gather: 2(n-1)/n copies per uplink) or "
         "all-to-all (every worker sends its whole delta to every peer: n-1 copies, one "
         "latency)",
         flag="--outer-sync", choices=OUTER_SYNCS,
         tools=_DILOCO_TOOLS,
         flag_help="scheme diloco, streaming-diloco: allreduce (default) or all-to-all"),
    _run("exchange", "fragments", "fragments",
         "scheme streaming-diloco: P, fragments synced in turn (a divisor of inner_steps)",
         flag="--fragments", metavar="P",
         tools=_DILOCO_TOOLS,
         flag_help="scheme streaming-diloco: fragments synced in turn, e.g. 2"),
    _run("exchange", "overlap_steps", "overlap_steps",
         "scheme streaming-diloco: tau, inner steps a fragment's sync overlaps "
         "(tau < inner_steps / fragments)",
         flag="--overlap-steps", metavar="TAU",
         tools=_DILOCO_TOOLS,
         flag_help="scheme streaming-diloco: inner steps each sync overlaps, e.g. 1"),
    _run("exchange", "merge_alpha", "merge_alpha",
         "scheme streaming-diloco: weight of the local fragment when its outer update lands "
         "(0 = take the global value)"),
    _run("exchange", "eager", "eager",
         "scheme streaming-diloco: eager updates, each rank averages its own pseudo-gradient "
         "as of the outer update (the tau overlapped steps included) with the others' as sent "
         "(false = every replica averages the same values)"),
    _run("exchange", "codec", "codec",
         "what gradient-like messages (partials, pushes, reduce steps, pseudo-gradients) "
         "carry: none | fp16 | bf16 | int8 | topk:FRACTION "
         "(lossy ones keep an error-feedback residual)",
         flag="--codec", metavar="{none,fp16,bf16,int8,topk:FRACTION}", kind=FlagKind.TEXT,
         flag_help="compress what every exchange sends (ako partials, ps pushes, all-reduce "
                   "reduce steps, diloco pseudo-gradients), with error feedback for the lossy "
                   "ones: none, fp16, bf16, int8 or topk:FRACTION, e.g. topk:0.01"),
    # ------------------------------------------------------------------ train
    _run("train", "workload", "workload",
         "a built-in (digits-mlp) or your factory (path/to/mymodel.py:make, pkg.mod:make)",
         flag="--workload", metavar="NAME", kind=FlagKind.TEXT,
         flag_help="what is trained: a built-in such as digits-mlp, or your own factory "
                   "returning an akocore.Workload, as path/to/mymodel.py:make or "
                   "package.module:make"),
    _run("train", "optimizer", "optimizer", "sgd | momentum | adam",
         flag="--optimizer", choices=OPTIMIZERS,
         flag_help="optimizer applied to each update, e.g. sgd"),
    _run("train", "lr", "lr", "learning rate per update",
         flag="--lr", metavar="FLOAT", flag_help="learning rate (> 0, per update step), e.g. 0.05"),
    _run("train", "batch_size", "batch_size", "examples per worker per round",
         flag="--batch-size", metavar="N", flag_help="examples per worker per round, e.g. 32"),
    _run("train", "seed", "seed",
         "seed of the initial parameters and the data order (same on every rank)",
         flag="--seed", metavar="N",
         flag_help="random seed (integer >= 0) for initial parameters and data order, e.g. 0"),
    _run("train", "rounds", "rounds", 'rounds per worker; "none" = stop by duration or accuracy',
         flag="--rounds", metavar="N", flag_help="stop after N rounds per worker, e.g. 100"),
    _run("train", "duration", "duration_s",
         'wall time of training, e.g. "300s"; "none" = no time limit',
         dump=_optional_duration, flag="--duration", metavar="DURATION", unit="s",
         flag_help="stop after this much run time, e.g. 300s or 5m; if rounds is not given "
                   "(flag, --set or file) the run stops by time alone"),
    _run("train", "target_accuracy", "target_accuracy",
         'stop once a replica reaches this test accuracy; "none" = never',
         flag="--target-accuracy", metavar="FRACTION",
         flag_help="stop once test accuracy reaches this fraction (0 < x <= 1), e.g. 0.9"),
    _run("train", "eval_every", "eval_every", "evaluate the local replica every N rounds"),
    _run("train", "data_path", "data_path",
         'dataset file for cifar10/mnist workloads; "none" = not needed'),
    # ------------------------------------------------------------------ akorun
    Key("akorun", "run_id", "run_id", "this run's id (uuid4 hex); every message carries it"),
    Key("akorun", "secret", "secret",
        "the run's secret, from which every pair key derives (keep private: this file is "
        'mode 0600); "none" when each rank has its own key file'),
    Key("akorun", "peer_timeout", "peer_timeout_s",
        "a peer silent this long leaves the SSP gate until it speaks again",
        dump=duration_exact_text, flag="--peer-timeout", metavar="DURATION", tools=AKORUN_TOOLS,
        unit="s",
        flag_help="a peer silent this long leaves the SSP gate until it speaks again, e.g. 10s"),
    Key("akorun", "join_timeout", "join_timeout_s",
        "how long a rank waits for every rank's hello at start",
        dump=duration_exact_text, flag="--join-timeout", metavar="DURATION", tools=AKORUN_TOOLS,
        unit="s",
        flag_help="how long to wait for every rank's hello at start, e.g. 120s"),
    Key("akorun", "checkpoint_every", "checkpoint_every",
        "write a checkpoint every N rounds (0 = only the final one)",
        flag="--checkpoint-every", metavar="N", tools=AKORUN_TOOLS,
        flag_help="write a checkpoint every N rounds, 0 = only the final one"),
    Key("akorun", "emulate", "emulate",
        "shape sends in-process to [network]: auto (loopback only) | on | off",
        flag="--emulate", choices=EMULATE_MODES, kind=FlagKind.SWITCH, tools=AKORUN_TOOLS,
        flag_help="shape every send in-process to [network] (bandwidth in bits/s, latency "
                  "per message): --emulate (on), --emulate auto (only when every rank is on "
                  "loopback) or --no-emulate (send at the real network's speed)"),
    Key("akorun", "queue_messages", "queue_messages",
        "messages owed to one peer before sending waits (backpressure)",
        flag="--queue-messages", metavar="N", tools=AKORUN_TOOLS,
        flag_help="messages owed to one peer before sending waits (backpressure), e.g. 64"),
    Key("akorun", "relay_budget", "relay_budget_bytes",
        "bytes of peers' partials a rank keeps to repair a lost peer's rounds; 0 = each "
        "peer's last min(2 s + 2, 2 p) rounds",
        flag="--relay-budget", metavar="SIZE", tools=AKORUN_TOOLS,
        flag_help="bytes of peers' partials each rank keeps to repair a lost peer's rounds "
                  "for the others (at least one partial, at most 2 p, per peer), e.g. 256MB; "
                  "default 0: each peer's last min(2 s + 2, 2 p) rounds, (n - 1) x that x "
                  "4 ceil(D / p) bytes"),
    Key("akorun", "devices_per_rank", "devices_per_rank",
        "devices each process of a rank steps on, data-parallel (an island of devices)",
        flag="--devices-per-rank", metavar="N", tools=AKORUN_TOOLS,
        flag_help="devices each process of a rank uses: the rank's step runs data-parallel "
                  "over them (a batch of --batch-size per device, one reduced gradient per "
                  "rank); on CPU, N host devices are made for it, e.g. 2"),
    Key("akorun", "processes_per_rank", "processes_per_rank",
        "processes of one rank, joined by jax.distributed (its leader talks to the others)",
        flag="--processes-per-rank", metavar="M", tools=AKORUN_TOOLS,
        flag_help="processes of one rank, joined by jax.distributed into one island (each "
                  "with --devices-per-rank devices); only process 0 talks to the other "
                  "ranks, e.g. 2"),
    Key("akorun", "platform", "platform",
        "where the ranks' JAX steps run: cpu | gpu | auto (JAX's own choice)",
        flag="--platform", choices=PLATFORMS, tools=AKORUN_TOOLS,
        flag_help="where the ranks' JAX steps run: cpu, gpu, or auto (JAX's own "
                  "choice: an accelerator when there is one)"),
    Key("akorun", "tls_cert", "tls_cert", 'PEM certificate each rank serves with; "" = plain HTTP',
        dump=lambda v: v or "", flag="--tls-cert", metavar="PEM", kind=FlagKind.TEXT,
        tools=frozenset({Tool.AKORUN_INIT, Tool.AKORUN_RANK}),
        flag_help="serve HTTPS with this certificate (every rank of the run)"),
    Key("akorun", "tls_key", "tls_key", 'PEM private key of tls_cert; "" = plain HTTP',
        dump=lambda v: v or "", flag="--tls-key", metavar="PEM", kind=FlagKind.TEXT,
        tools=frozenset({Tool.AKORUN_INIT, Tool.AKORUN_RANK}),
        flag_help="private key of --tls-cert"),
    Key("akorun", "keys", "keys",
        'this rank\'s key file (akorun init --per-rank-keys; {rank} = the rank); "" = from '
        "secret", dump=lambda v: v or "", flag="--keys", metavar="FILE", kind=FlagKind.TEXT,
        tools=frozenset({Tool.AKORUN_RANK}),
        flag_help="this rank's key file written by `akorun init --per-rank-keys DIR` (its row "
                  "of pair keys; the cluster file then holds no secret); {rank} stands for "
                  "the rank, e.g. keys/rank-{rank}.keys"),
    Key("akorun", "allow", "allow",
        'peer addresses or networks let in, "hosts" = those of cluster.hosts; [] = any',
        dump=list, flag="--allow", metavar="ADDR[,ADDR...]", kind=FlagKind.TEXT,
        tools=frozenset({Tool.AKORUN_INIT, Tool.AKORUN_RANK}),
        flag_help="accept connections only from these addresses or networks (e.g. "
                  "10.0.0.1,10.0.1.0/24, or hosts = every address in cluster.hosts); others "
                  "are closed before any byte is read"),

    # ------------------------------------------------------------------ akosim
    Key("akosim", "compute", "compute",
        'compute time per round, e.g. "300ms", or "measure" (this machine\'s step, cached) '
        'or "remeasure"', dump=_dump_compute, flag="--compute",
        metavar="DURATION|measure|remeasure", tools=frozenset({Tool.AKOSIM_PLAN}), unit="ms",
        flag_help="compute time per round, e.g. 0.3s or 250ms; 'measure' times the real "
                  "--workload gradient step on this machine once and caches it (default; "
                  "$AKO_CACHE_DIR, $XDG_CACHE_HOME/ako-toolkit or ~/.cache/ako-toolkit); "
                  "'remeasure' times it again and refreshes the cache"),
    Key("akosim", "message_overhead", "message_overhead_s",
        'per-message time beyond the wire, added to every link\'s latency; "none" = 0 or '
        "what --compute-from's run measured", dump=_optional_duration,
        flag="--message-overhead", metavar="DURATION", tools=frozenset({Tool.AKOSIM_PLAN}),
        unit="ms",
        flag_help="per-message time beyond the wire (software stack: HTTP, verification, "
                  "apply), added to every link's latency, e.g. 2ms (default 0, or what "
                  "--compute-from's result measured)"),
    Key("akosim", "coalesce", "coalesce",
        'messages within this fraction of their duration finish together; "none" = 1e-4',
        flag="--coalesce", metavar="FRACTION", tools=frozenset({Tool.AKOSIM_PLAN}),
        flag_help="messages whose remaining transfer is within this fraction of their own "
                  "duration finish together (default 1e-4); 0.01-0.03 makes networks where "
                  "every link has its own rate much faster to simulate, each message at most "
                  "1-3%% early"),
)

# section -> name -> Key, in registry order
SECTIONS: dict[str, dict[str, Key]] = {}
for _key in KEYS:
    SECTIONS.setdefault(_key.section, {})[_key.name] = _key
BY_DOTTED: dict[str, Key] = {key.dotted: key for key in KEYS}
BY_FIELD: dict[tuple[str, str], Key] = {(key.section, key.field): key for key in KEYS}


def key_of(dotted: str) -> Key:
    """The Key named "section.name"; KeyError if there is none."""
    return BY_DOTTED[dotted]


def flag_keys(tool: Tool, section: str | None = None) -> tuple[Key, ...]:
    """The keys `tool` takes as flags, in registry order (optionally one section's)."""
    return tuple(key for key in KEYS if key.flag and tool in key.tools
                 and (section is None or key.section == section))


def default_of(dotted: str) -> Any:
    """The built-in default of one key (typed, SI units)."""
    return key_of(dotted).default
