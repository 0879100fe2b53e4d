"""Bring your own workload: the `Workload` protocol, its data sources and adapters.

A workload is initial parameters (any JAX pytree, or a function of the seed), a
loss ``(params, batch, rng) -> loss``, an evaluation ``(params, batch) ->
accuracy``, a data source and an optional optimizer. The built-in workloads are
factories returning one (akocore.workloads.builtin), and so is the user's:
``--workload path/to/mymodel.py:make`` in akosim and akorun.

Example::

    from akocore.workloads import ArrayData, Workload, from_flax

    def make(width: int = 64):
        x_train, y_train, x_test, y_test = my_arrays()
        return from_flax(MyFlaxModule(width), example_input=x_train[:1],
                         data=ArrayData(x_train, y_train, x_test, y_test))

Adapters: `from_flax` (a flax.linen Module), `from_nnx` (a flax.nnx Module),
`from_equinox` (an equinox Module); plain JAX functions need none. The adapters
import Flax or Equinox only when called (``pip install 'akosim[flax]'`` or
``'akosim[equinox]'``).
"""

from akocore.workloads.adapters import classifier_loss, from_equinox, from_flax, from_nnx
from akocore.workloads.sources import ArrayData, BatchFactory
from akocore.workloads.spec import DataSource, Workload

__all__ = [
    "ArrayData",
    "BatchFactory",
    "DataSource",
    "Workload",
    "classifier_loss",
    "from_equinox",
    "from_flax",
    "from_nnx",
]
