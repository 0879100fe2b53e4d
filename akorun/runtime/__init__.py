"""One akorun rank, wired together by akorun.runtime.worker.Worker.

At the root: worker (the composition root), rank_context (the rank's frozen context and
its event hub), rank_options (what the launcher gives a rank), endpoints (host:port and
the allow-list), roles (what differs per scheme and role), node_plan, outbox (senders and
byte counters), fault_hooks (test hooks, no-op by default) and island (a rank on several
devices). The rooms say the lifecycle:

- lifecycle: phase, startup_phase, prepare, join, greeting, training, evaluation,
  stopping, finishing
- liveness: peer_liveness (who is alive), waiting (the gate, every wait, stop requests)
- recovery: rank_recovery, relay, rejoin, anchor_sync
- records: rank_result, result_files, round_times, reporting, checkpoints and their files

Nothing here imports akorun.launching (tests/test_architecture.py checks).
"""
