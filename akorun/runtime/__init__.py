"""The collaborators of one akorun rank, wired together by akorun.runtime.worker.Worker.

phase (run phase state machine), roles (what differs per scheme and role),
prepare (workload, warm-up, checkpoint to resume from), join and rejoin
(handshakes), liveness (who is alive), relay (survivors forward a lost
rank's partials to each other), waiting (the gate and every other wait,
stop requests), outbox (senders and byte counters), training (the round loop
with evaluation and checkpoint triggers), evaluation, checkpoints, finishing,
results (the per-rank result record), reporting (status, metrics, progress),
fault_hooks (test hooks, no-op by default).
"""
