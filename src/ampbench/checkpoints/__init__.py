"""What a seed's training leaves on disk: checkpoints and model files, written atomically."""
