"""The key registry: every setting once, with everything the edges need to know.

One `Key` per setting: its section and TOML name, the dataclass field it
fills, how its typed value is written back as a human value (``dump``), a
one-line comment (cluster files), and, when a command line takes it, the
flag, its help text and which commands (`Tool`) offer it. The TOML mapping,
the ``--set`` keys, the argparse flags of akosim and akorun, the cluster
file's comments and ``--show-config`` are all generated from `KEYS`.

Built-in defaults are NOT written here: each is the field default of its
section's dataclass in akocore.settings.schema, and `Key.default` reads it.

A scheme's knobs are not written here either: `current()` generates one key
``exchange.<name>`` per field of every registered scheme's settings class
(akocore.schemes.knobs), with the comment, flag, parser's unit and default its
field's metadata gives (`Key.table` names its table, ``[exchange.<table>]``;
its `field` is ExchangeConfig's ``tables``, which holds it), and the choices
and help of ``exchange.scheme`` from the registered schemes and their presets.
`current()` is rebuilt when the scheme registry changes; `KEYS`, `SECTIONS`
and `BY_DOTTED` are the keys of the built-in schemes, as imported.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from akocore.schemes import registry as scheme_registry
from akocore.schemes.knobs import SchemeSettings, knob_of
from akocore.schemes.named import SCHEME_NAMES, scheme_choices
from akocore.schemes.registry import settings_tables
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
TABLES_FIELD = "tables"  # the ExchangeConfig field that holds every scheme's knobs
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
    # a scheme's knob: its table ([exchange.<table>]) and settings class; its `field` is
    # then "tables", the ExchangeConfig field that holds every scheme's settings
    table: str | None = None
    holder: type | None = None

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def init_name(self) -> str:
        """The keyword its section's dataclass takes it by (a knob: its name)."""
        return self.name if self.table else self.field

    def value_in(self, holder: Any) -> Any:
        """Its typed value in `holder`, an object of its section's dataclass."""
        if self.table and self.holder is not None:
            return getattr(holder.knobs(self.holder), self.name)
        return getattr(holder, self.field)

    @property
    def default(self) -> Any:
        """The built-in default (typed), read from the section dataclass (a knob: from its
        scheme's settings class)."""
        for item in dataclasses.fields(self.holder or SECTION_TYPES[self.section]):
            if self.table and item.name == self.name:
                return item.default
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


# the commands that take a scheme's knobs as flags (a rank reads them from the cluster file)
SCHEME_TOOLS = frozenset({Tool.AKOSIM, Tool.AKORUN_INIT, Tool.AKORUN_LAUNCH})

_EARLIER_KEYS: tuple[Key, ...] = (
    # ------------------------------------------------------------------ cluster
    _run("cluster", "workers", "workers",
         "number of ranks (for scheme ps: training workers + parameter servers)",
         flag="--workers", metavar="N", flag_help="number of worker nodes (>= 2), e.g. 8"),
    _run("cluster", "hosts", "hosts", '"host:port" each rank listens on, rank 0 first',
         dump=list),
    _run("cluster", "devices_per_rank", "devices_per_rank",
         "devices per rank: an island whose devices share each round's work data-parallel "
         "(batch_size per device) and reduce inside before the rank exchanges; a list goes "
         "round robin", dump=list),
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
    _run("network", "inside_bandwidth", "inside_bandwidth_bps",
         'akosim: each island\'s inside network joining its devices (a ring); "inf" = '
         "free; a list goes round robin over ranks",
         dump=lambda values: [bandwidth_exact_text(v) if math.isfinite(v) else "inf"
                              for v in values], unit="gbps"),
    _run("network", "inside_latency", "inside_latency_s",
         "akosim: one-way latency between two devices of an island; a list goes round robin",
         dump=_duration_list, unit="us"),
    # ------------------------------------------------------------------ exchange
    _run("exchange", "scheme", "scheme",
         "the exchange scheme, or a named scheme (its comment and flag help are written "
         "from the registered schemes)",
         flag="--scheme", choices=SCHEME_NAMES),
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
    _run("exchange", "reduce", "reduce", "mean (1/n of the summed gradients) | sum (as TF.AKO)"),
    _run("exchange", "utilisation", "utilisation",
         "p auto: target fraction of the uplink, 0 < u <= 1"),
    _run("exchange", "p_max", "p_max", "p auto: largest p allowed"),
    _run("exchange", "codec", "codec",
         "what gradient-like messages (partials, pushes, reduce steps, pseudo-gradients) "
         "carry: none | fp16 | bf16 | int8 | topk:FRACTION | "
         "ctopk:FRACTION[:CHUNK[:BITS[:DECAY]]] (lossy ones keep an error-feedback residual)",
         flag="--codec", metavar="{none,fp16,bf16,int8,topk:FRACTION}", kind=FlagKind.TEXT,
         flag_help="compress what every exchange sends (ako partials, ps pushes, all-reduce "
                   "reduce steps, diloco pseudo-gradients), with error feedback for the lossy "
                   "ones: none, fp16, bf16, int8, topk:FRACTION (e.g. topk:0.01) or "
                   "ctopk:FRACTION[:CHUNK[:BITS[:DECAY]]] (chunked top-k at BITS bits)"),
)

_LATER_KEYS: tuple[Key, ...] = (
    # ------------------------------------------------------------------ train
    _run("train", "workload", "workload",
         "a built-in (digits-mlp) or your factory (path/to/mymodel.py:make, pkg.mod:make)",
         flag="--workload", metavar="NAME", kind=FlagKind.TEXT,
         flag_help="what is trained: a built-in such as digits-mlp, or your own factory "
                   "returning an akocore.Workload, as path/to/mymodel.py:make or "
                   "package.module:make"),
    _run("train", "optimizer", "optimizer", "sgd | momentum | adam | adagrad | muon",
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



def _knob_key(kind: type[SchemeSettings], item: dataclasses.Field[Any]) -> Key:
    """The key exchange.<name> of one knob of a scheme's settings class."""
    knob = knob_of(item)
    return Key("exchange", item.name, TABLES_FIELD, knob.help, dump=knob.dump, flag=knob.flag,
               flag_help=knob.flag_help.replace("%", "%%"), metavar=knob.metavar,
               choices=knob.choices,
               tools=SCHEME_TOOLS if knob.flag else frozenset(),
               kind=FlagKind.TEXT if knob.text else FlagKind.VALUE, unit=knob.unit,
               table=kind.table, holder=kind)


@dataclass(frozen=True)
class Registry:
    """Every key of the registered schemes, and the lookups the layers use."""

    keys: tuple[Key, ...]
    sections: dict[str, dict[str, Key]]  # section -> name -> Key, in registry order
    by_dotted: dict[str, Key]
    tables: dict[str, type[SchemeSettings]]  # [exchange.<table>] -> its settings class


def _scheme_key(schemes: Mapping[str, Any]) -> Key:
    """exchange.scheme with the registered schemes and their presets as its choices,
    comment and flag help."""
    presets = [preset for scheme in schemes.values() for preset in scheme.presets
               if preset.name not in schemes]
    named = " ".join(f"{preset.name} ({preset.core_scheme})" for preset in presets)
    summaries = ", ".join(f"{name} ({scheme.summary})" for name, scheme in schemes.items())
    flag_help = (f"exchange: {summaries}; or a named scheme that stands for settings of "
                 f"one: {', '.join(preset.name for preset in presets)} (as "
                 f"configs/presets/NAME.toml)")
    return dataclasses.replace(
        _EARLIER_KEYS[_SCHEME_INDEX], choices=scheme_choices(),
        comment=f"{' | '.join(schemes)} (see the guide's Exchange schemes), or a named "
                f"scheme: {named} (each stands for settings of the scheme beside it)",
        flag_help=flag_help.replace("%", "%%"))


def _build(schemes: Mapping[str, Any]) -> Registry:
    tables = settings_tables()
    scheme_key = _scheme_key(schemes)
    knob_keys = tuple(_knob_key(kind, item) for kind in tables.values()
                      for item in dataclasses.fields(kind))
    keys = (*_EARLIER_KEYS[:_SCHEME_INDEX], scheme_key, *_EARLIER_KEYS[_SCHEME_INDEX + 1:],
            *knob_keys, *_LATER_KEYS)
    sections: dict[str, dict[str, Key]] = {}
    for key in keys:
        sections.setdefault(key.section, {})[key.name] = key
    return Registry(keys, sections, {key.dotted: key for key in keys}, tables)


_SCHEME_INDEX = next(i for i, key in enumerate(_EARLIER_KEYS) if key.dotted == "exchange.scheme")
_built: list[tuple[Mapping[str, Any], Registry]] = []


def current() -> Registry:
    """The keys of the schemes registered now (rebuilt when the scheme registry changes,
    as a test that registers a scheme of its own does)."""
    schemes = scheme_registry.registered()
    if not _built or _built[0][0] is not schemes:
        _built[:] = [(schemes, _build(schemes))]
    return _built[0][1]


# the keys of the built-in schemes, as imported (current() follows the scheme registry)
KEYS: tuple[Key, ...] = current().keys
SECTIONS: dict[str, dict[str, Key]] = current().sections
BY_DOTTED: dict[str, Key] = current().by_dotted


def key_of(dotted: str) -> Key:
    """The Key named "section.name"; KeyError if there is none."""
    return current().by_dotted[dotted]


def flag_keys(tool: Tool, section: str | None = None) -> tuple[Key, ...]:
    """The keys `tool` takes as flags, in registry order (optionally one section's)."""
    return tuple(key for key in current().keys if key.flag and tool in key.tools
                 and (section is None or key.section == section))


def default_of(dotted: str) -> Any:
    """The built-in default of one key (typed, SI units)."""
    return key_of(dotted).default
