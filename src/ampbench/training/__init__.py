"""Training, the same for every variant: model, precision, parallelism, step, loop, batches, progress.

Imports no mlflow: what is recorded is the tracking package's business, called through hooks.
"""
