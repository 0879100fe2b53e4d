"""akocore: the pure core shared by akosim and akorun.

Units, configuration, JAX workloads and the reference semantics of Ako
(partitions, exchange schemes, the SSP gate and the p planner). Nothing in
this package opens a socket, reads a clock or runs an event loop; the one
change of process-wide state (JAX's compilation cache) is
akocore.process_setup, which only a shell calls.

Where things live: `settings` (what a run is, its layers and flags), `schemes`
(each exchange scheme, its nodes and knobs), `codecs` (what a send carries),
`workloads` (the Workload protocol, built-in models, the flat view both shells
train, how its step is timed), `data` (the built-in datasets), `records` (every
result file as a typed record), `hosttools` (the ip/tc command text of a netns
testbed); at the root, the reference semantics of Ako (`partition`, `ssp`,
`planner`, `messages`, `resolve`) and the small shared edges (`units`,
`cli_support`, `optim`, `process_setup`, `rank_threads`, `hostinfo`, `extras`).

Bring your own model: a `Workload` (initial parameters, loss, evaluation, data,
optimizer) returned by a factory in your file trains with ``akorun launch
--workload ./mymodel.py:make`` and is planned with ``akosim --workload
./mymodel.py:make``::

    from akocore import ArrayData, Workload

    def make():
        return Workload(init=init_params, loss=loss, evaluate=accuracy,
                        data=ArrayData(x_train, y_train, x_test, y_test))

`build_workload` gives the flat float32 view both shells train, and
`workload_fingerprint` the digest every rank of a run must share.

Read any result (akorun's run directory or ``result.json``, akosim's ``--out``
file) as a typed record::

    import akocore
    run = akocore.read_result("runs/mine")      # a RunResult
    print(run.accuracy, run.round_time_s, run.max_relative_difference)
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from akocore.records.result_reader import read_result
    from akocore.records.results import PlanResult, RankResult, RunResult
    from akocore.workloads import ArrayData, BatchFactory, Workload
    from akocore.workloads.flat import (
        FlatWorkload,
        build_workload,
        flat_workload,
        workload_fingerprint,
    )

__version__ = "0.1.0"

# loaded on first use, so importing one small akocore module stays cheap
_EXPORTS = {
    "ArrayData": "akocore.workloads",
    "BatchFactory": "akocore.workloads",
    "Workload": "akocore.workloads",
    "FlatWorkload": "akocore.workloads.flat",
    "build_workload": "akocore.workloads.flat",
    "flat_workload": "akocore.workloads.flat",
    "workload_fingerprint": "akocore.workloads.flat",
    "read_result": "akocore.records.result_reader",
    "PlanResult": "akocore.records.results",
    "RankResult": "akocore.records.results",
    "RunResult": "akocore.records.results",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'akocore' has no attribute {name!r}")

__all__ = [
    "ArrayData",
    "BatchFactory",
    "FlatWorkload",
    "PlanResult",
    "RankResult",
    "RunResult",
    "Workload",
    "build_workload",
    "flat_workload",
    "read_result",
    "workload_fingerprint",
]
