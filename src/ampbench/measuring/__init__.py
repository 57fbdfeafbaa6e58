"""Measuring training speed, apart from the study: `kit` (a trainer built as the train stage builds
it, a clock read after the device's queued work, warm-up, FLOPs, the dataset), `throughput` (ampbench
bench: pipeline, ceiling, DataLoader), `rungs` and `crossover` (ampbench explain: AMP's speed-up rung
by rung and over batch sizes)."""
