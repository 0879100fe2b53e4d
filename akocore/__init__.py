"""akocore: the pure core shared by akosim and akorun.

Units, configuration, JAX workloads and the reference semantics of Ako
(partitions, exchange schemes, the SSP gate and the p planner). Nothing in
this package opens a socket, reads a clock or runs an event loop.
"""

__version__ = "0.1.0"
