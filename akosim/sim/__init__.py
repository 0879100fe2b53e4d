"""The simulation: the SimPy engine, scenarios, closed forms, simulated training."""
