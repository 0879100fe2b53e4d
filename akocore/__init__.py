"""akocore: the pure core shared by akosim and akorun.

Units, configuration, JAX workloads and the reference semantics of Ako
(partitions, exchange schemes, the SSP gate and the p planner). Nothing in
this package opens a socket, reads a clock or runs an event loop; the one
change of process-wide state (JAX's compilation cache) is
akocore.process_setup, which only a shell calls.
"""

__version__ = "0.1.0"
