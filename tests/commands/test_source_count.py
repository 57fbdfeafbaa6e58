"""The estimate's image counts of a local ImageFolder source not yet prepared (hostile passes:
`make run DATA=<480 images>` estimated "about 1 d 2 h", counting CIFAR-10's 60,000, for a study that
took 8 minutes)."""

from __future__ import annotations

import tarfile

from ampbench.commands.source_count import image_counts
from conftest import image_folder_archive


def test_an_archive_or_folder_is_counted_from_its_names_with_the_subsets(tmp_path):
    archive = image_folder_archive(tmp_path, per_class=24, test_per_class=3)
    folder = tmp_path / "imagefolder"
    (folder / "train" / "cat" / "notes.txt").write_text("not an image", encoding="utf-8")
    (folder / "train" / "cat" / ".hidden.png").write_bytes(b"")
    assert image_counts(str(archive)) == (240, 30)
    assert image_counts(str(folder)) == (240, 30)
    assert image_counts(folder.as_uri()) == (240, 30)
    assert image_counts(str(archive), train_per_class=5, test_per_class=2) == (50, 20)


def test_what_names_cannot_tell_is_left_to_cifars_sizes(tmp_path):
    cifar = tmp_path / "cifar.tar.gz"
    with tarfile.open(cifar, "w:gz") as tar:  # the python format: batches, no class folders
        (tmp_path / "data_batch_1").write_bytes(b"x")
        tar.add(tmp_path / "data_batch_1", "cifar-10-batches-py/data_batch_1")
    (tmp_path / "page.tar.gz").write_text("<html></html>", encoding="utf-8")
    for url in ("https://example.org/c.tar.gz", str(cifar), str(tmp_path / "page.tar.gz"), "/nonexistent"):
        assert image_counts(url) is None, url
