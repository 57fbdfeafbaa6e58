"""The pipeline's stages as functions the CLI calls: train, evaluate, bench, and the DDP launcher."""
