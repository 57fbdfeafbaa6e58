"""MLflow recording (rank 0 only): the store, runs, per-epoch metrics, the stages' records."""
