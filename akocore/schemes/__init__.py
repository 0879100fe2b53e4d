"""Per-node exchange state machines: ako, ps (sync, async, elastic, local-step
and per-worker-lr variants), allreduce and wagma.

A scheme node takes events and returns effects; it never sleeps, sends or
reads a clock. The shells drive every worker node the same way:

    t = 0
    while the run goes on:
        wait until node.may_start(t)            # the SSP gate
        grad = gradient of node.params          # None in timing-only mode
        deliver node.local_step(t, grad)        # Send effects
        t += 1
    deliver node.finish(t)                       # flush what is still owed
    wait until node.drained()                    # every live peer's last message
    node.settle()                                # fold in what arrived last

and hand every message that arrives to `node.receive(msg)`, delivering the
effects of its Receipt. Server nodes (ps) only receive.

Each node owns its replica as one flat float32 vector (`params`) and applies
updates through a FlatOptimizer. With `params=None` a node does all the
bookkeeping (who sends what to whom, how long, which round) without any
arithmetic: that is akosim's timing-only mode.

A run's codec (akocore.codecs) is put on every node's sends by build_nodes
(akocore.codecs.exchange.attach_codec); a scheme never calls a codec.

Modules: base (SchemeNode, Replica, SchemeError), protocol (Scheme: one
scheme as one object), recovery (what the shells recover a node with: the
DeliveryRecorded, Recoverable and Resyncable protocols a node's capabilities
return, and the state and snapshot they hand out), knobs (a scheme's settings
class: every knob's default, help, parser and flag; presets), one module per scheme (ako,
ps_family with ps, elastic and localps, allreduce, wagma, diloco with
diloco_sync and diloco_settings), registry (every scheme by name), named (the
presets --scheme NAME stands for, read from the schemes) and factory
(SchemeSpec, build_nodes). This package re-exports their public names.
"""

from akocore.schemes.ako import SCHEDULES, AkoWorker, ako_partition
from akocore.schemes.allreduce import AllReduceWorker
from akocore.schemes.base import REDUCES, Replica, SchemeError, SchemeNode, copy_or_none
from akocore.schemes.elastic import ElasticServer, ElasticWorker, elastic_alpha
from akocore.schemes.factory import SchemeSpec, build_node, build_nodes
from akocore.schemes.localps import (
    DeltaPSServer,
    LocalStepPSWorker,
    ScaledPSWorker,
    SyncDeltaPSServer,
)
from akocore.schemes.protocol import Scheme
from akocore.schemes.ps import PSLayout, PSServer, PSWorker
from akocore.schemes.ps_family import PS_MODES
from akocore.schemes.recovery import (
    DeliveryRecord,
    DeliveryRecorded,
    Recoverable,
    RecoveryState,
    RejoinSnapshot,
    Resyncable,
)
from akocore.schemes.registry import REGISTRY, SCHEMES, scheme_named
from akocore.schemes.wagma import WagmaWorker, butterfly_group, butterfly_phases

__all__ = [
    "REGISTRY",
    "Scheme",
    "scheme_named",
    "PS_MODES",
    "REDUCES",
    "SCHEDULES",
    "SCHEMES",
    "AkoWorker",
    "AllReduceWorker",
    "DeltaPSServer",
    "ElasticServer",
    "ElasticWorker",
    "LocalStepPSWorker",
    "ScaledPSWorker",
    "WagmaWorker",
    "build_node",
    "butterfly_group",
    "butterfly_phases",
    "elastic_alpha",
    "DeliveryRecord",
    "DeliveryRecorded",
    "Recoverable",
    "RecoveryState",
    "Resyncable",
    "PSLayout",
    "PSServer",
    "PSWorker",
    "RejoinSnapshot",
    "Replica",
    "SchemeError",
    "SchemeNode",
    "SchemeSpec",
    "SyncDeltaPSServer",
    "ako_partition",
    "build_nodes",
    "copy_or_none",
]
