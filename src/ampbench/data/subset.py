"""The configured per-class subset of a split (data.train_per_class, data.test_per_class)."""

from __future__ import annotations

import os

import torch

from ampbench.data.errors import DataError


def balanced_subset(
    images: torch.Tensor, labels: torch.Tensor, per_class: int, split: str = "train", classes=()
) -> tuple:
    """The first `per_class` samples of every class, in original order; 0 keeps everything.
    ``split`` and ``classes`` (names by label) are for the line when a class has fewer."""
    if per_class < 0:
        raise DataError(f"per_class must be >= 0, got {per_class}")
    if per_class == 0:
        return images, labels
    counts = {c: int((labels == c).sum()) for c in labels.unique().tolist()}
    short = {c: n for c, n in counts.items() if n < per_class}
    if short:  # hostile pass P: "class 0 has 24 samples, fewer than the 100 asked": which, and the fix
        first = min(short)
        name = classes[first] if first < len(classes) else first
        more = f" ({len(short)} classes have fewer)" if len(short) > 1 else ""
        fewest, flag = min(short.values()), "per_class" if split == "train" else "test_per_class"
        fix = f"set data.{split}_per_class to at most {fewest}"
        if os.environ.get("AMPBENCH_SCOPE") == "variant":  # hostile pass T: quick=yes's 100 wins over params
            option = f"--{flag.replace('_', '-')} {fewest}"
            fix = f"give `mlflow run` -P {flag}={fewest} (`ampbench variant` {option})"
        raise DataError(
            f"data.{split}_per_class={per_class} asks for {per_class} {split} images per class, but class "
            f"{str(name)!r} has {short[first]}{more}: {fix}, or 0 for every image"
        )
    keep = [(labels == c).nonzero().flatten()[:per_class] for c in counts]
    order = torch.cat(keep).sort().values  # restore the original interleaving of classes
    return images[order].contiguous(), labels[order]
