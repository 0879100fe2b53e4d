"""Getting the run whole again after a loss: rank_recovery (what the scheme can recover,
the role hands it out), relay (survivors forward a lost rank's partials to each other),
rejoin (a restarted rank comes back from a donor), anchor_sync (diloco's anchor re-sync)."""
