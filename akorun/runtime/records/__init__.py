"""What a rank writes and reports: rank_result and result_files (the per-rank result
record), round_times, reporting (status, metrics, progress) and the checkpoints
(checkpoints, checkpoint_file and its npz and orbax formats)."""
