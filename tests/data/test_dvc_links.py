"""The download stage's outputs are replaced, never written in place: DVC checks outputs out as
hard links into its cache (cache type hardlink), and a write through the link rewrites the cache
itself (final pass L: after `ampbench download --set data.url=...`, .dvc/cache objects no longer
matched their names; `dvc repro` then checked the wrong data out and could not recover)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ampbench import atomic
from ampbench.data import prepared


def _linked(target: Path, cache: Path, text: str) -> None:
    cache.write_text(text, encoding="utf-8")
    os.link(cache, target)  # what `dvc checkout` made


def test_a_text_output_linked_into_a_cache_is_replaced_not_written_through(tmp_path):
    cache, out = tmp_path / "cache-object", tmp_path / "source.json"
    _linked(out, cache, "old")
    atomic.atomic_write_text(out, "new")
    assert out.read_text(encoding="utf-8") == "new" and cache.read_text(encoding="utf-8") == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache-object", "source.json"]  # no temp left


def test_the_prepared_data_sets_digest_file_is_replaced_too(tmp_path):
    path = tmp_path / "cifar10.pt"
    digest = path.with_name(path.name + ".sha256")
    cache = tmp_path / "digest-in-cache"
    _linked(digest, cache, '{"sha256": "of the old data"}\n')
    prepared.save_dataset({"train_images": torch.zeros(1, 3, 2, 2, dtype=torch.uint8)}, path)
    assert cache.read_text(encoding="utf-8") == '{"sha256": "of the old data"}\n'
    assert digest.read_text(encoding="utf-8") != cache.read_text(encoding="utf-8")
