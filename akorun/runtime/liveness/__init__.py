"""Who is alive and what the rank waits for: peer_liveness (last-heard times, heartbeats,
suspensions, stuck peers given up) and waiting (the gate and every other wait, the stop
reason)."""
