"""akosim: the simulator shell (network model, SimPy processes, CLI, reports)."""
