"""A rank's life in order: prepare (workload, warm-up, checkpoint to resume from; the
startup phase file), join (hello every rank, p auto, build the node; greeting's retries),
train (the round loop, evaluations, the stop agreement) and finish (flush, drain, settle,
results, "done"); the phase machine that says where the rank is."""
