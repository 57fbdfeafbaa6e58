"""Tests for ampbench.data.fetch and ampbench.data.prepared: download, verification, safe extraction, readers
and subsets.

Everything runs against tiny archives built in tmp_path and served from 127.0.0.1, so no network
is needed. The official-URL path is exercised by pointing CIFAR10_URL/CIFAR10_MD5 at the fake.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import logging
import os
import pickle
import tarfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision

from ampbench.data import fetch, prepared
from conftest import free_port

TRAIN_PER_BATCH, N_TEST = 20, 30  # 5 batches -> 100 train images, 10 per class
# The tests encode images with torchvision.io, which warns that it prefers torchcodec.
pytestmark = pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch):
    monkeypatch.setattr(fetch, "_BACKOFF_S", 0.0)  # retries must not slow the suite down


def _files_in(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def _tar_gz(path: Path, folder: Path, arcname: str) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        tar.add(folder, arcname=arcname)
    return path


# ---------------------------------------------------------------- fake CIFAR python archive
def _cifar_batch(rng: np.random.Generator, n: int) -> dict:
    labels = [i % 10 for i in range(n)]
    rng.shuffle(labels)
    # Same layout as the real batches once loaded with encoding="latin1" (which is what
    # torchvision does): str keys, uint8 (n, 3072) rows in CHW order, list of int labels.
    return {
        "batch_label": "fake",
        "labels": labels,
        "data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
        "filenames": [f"img{i}.png" for i in range(n)],
    }


@pytest.fixture
def cifar_dir(tmp_path, monkeypatch) -> tuple[Path, dict]:
    """A folder holding a fake cifar-10-batches-py/, with torchvision's MD5 table patched to it."""
    rng = np.random.default_rng(0)
    batches_dir = tmp_path / "cifar-src" / "cifar-10-batches-py"
    batches_dir.mkdir(parents=True)
    batches = {f"data_batch_{i}": _cifar_batch(rng, TRAIN_PER_BATCH) for i in range(1, 6)}
    batches["test_batch"] = _cifar_batch(rng, N_TEST)
    meta = {"label_names": list(prepared.CIFAR10_CLASSES), "num_cases_per_batch": TRAIN_PER_BATCH}
    md5 = {}
    for name, content in [*batches.items(), ("batches.meta", meta)]:
        raw = pickle.dumps(content, protocol=2)
        (batches_dir / name).write_bytes(raw)
        md5[name] = hashlib.md5(raw).hexdigest()
    cls = torchvision.datasets.CIFAR10
    train_list = [[f"data_batch_{i}", md5[f"data_batch_{i}"]] for i in range(1, 6)]
    monkeypatch.setattr(cls, "train_list", train_list)
    monkeypatch.setattr(cls, "test_list", [["test_batch", md5["test_batch"]]])
    monkeypatch.setattr(cls, "meta", {**cls.meta, "md5": md5["batches.meta"]})
    return tmp_path / "cifar-src", batches


@pytest.fixture
def cifar_tarball(cifar_dir, tmp_path) -> bytes:
    path = _tar_gz(
        tmp_path / "cifar-10-python.tar.gz", cifar_dir[0] / "cifar-10-batches-py", "cifar-10-batches-py"
    )
    return path.read_bytes()


# ---------------------------------------------------------------- fake ImageFolder tree
def _image(value: int, size: int = 32) -> torch.Tensor:
    return torch.full((3, size, size), value, dtype=torch.uint8)


@pytest.fixture
def image_folder(tmp_path) -> Path:
    """mydata/{train,test}/<cifar class>/*.png (+ one jpg per class); pixel value encodes label."""
    root = tmp_path / "imgs" / "mydata"
    for split, n in (("train", 3), ("test", 2)):
        for label, name in enumerate(prepared.CIFAR10_CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                png = torchvision.io.encode_png(_image(label * 20 + i))
                (folder / f"{i}.png").write_bytes(png.numpy().tobytes())
            jpg = torchvision.io.encode_jpeg(_image(label * 20 + 10), quality=95)
            (folder / "z.jpg").write_bytes(jpg.numpy().tobytes())
    return root


# ---------------------------------------------------------------- local HTTP server
class _Server:
    """State shared with the handler: files to serve, how many requests to spoil, and how."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.mode = "ok"  # "truncate" or "corrupt" for the first `bad_first` requests
        self.bad_first = 0
        self.requests = 0
        self.lock = threading.Lock()
        self.port = 0

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"


@pytest.fixture
def server():
    state = _Server()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            with state.lock:
                state.requests += 1
                spoil = state.requests <= state.bad_first
            body = state.files.get(self.path.lstrip("/"))
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if spoil and state.mode == "truncate":  # promise everything, deliver half, hang up
                self.wfile.write(body[: len(body) // 2])
                self.close_connection = True
                return
            if spoil and state.mode == "corrupt":  # same length, one byte flipped
                body = bytes([body[0] ^ 0xFF]) + body[1:]
            self.wfile.write(body)

        def log_message(self, *args):  # keep test output quiet
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = httpd.server_port
    # A short poll interval: shutdown() waits for it, once per test that uses the server.
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()
    thread.join()


@pytest.fixture
def official(server, cifar_tarball, monkeypatch) -> str:
    """Serve the fake tarball as if it were the official URL, with its MD5 as the official MD5."""
    server.files["cifar-10-python.tar.gz"] = cifar_tarball
    url = server.url("cifar-10-python.tar.gz")
    monkeypatch.setattr(fetch, "CIFAR10_URL", url)
    monkeypatch.setattr(fetch, "CIFAR10_MD5", hashlib.md5(cifar_tarball).hexdigest())
    return url


# ---------------------------------------------------------------- end to end
def test_prepare_official_archive_end_to_end(official, server, cifar_dir, tmp_path):
    out, cache = tmp_path / "out" / "ds.pt", tmp_path / "cache"
    summary = prepared.prepare(official, out, cache)
    assert summary == {
        "train": 5 * TRAIN_PER_BATCH,
        "test": N_TEST,
        "classes": list(prepared.CIFAR10_CLASSES),
        "format": "cifar-python",
    }
    ds = prepared.load_dataset(out)
    assert ds["classes"] == list(prepared.CIFAR10_CLASSES)
    for split, n in (("train", 5 * TRAIN_PER_BATCH), ("test", N_TEST)):
        images, labels = ds[f"{split}_images"], ds[f"{split}_labels"]
        assert images.dtype == torch.uint8 and images.shape == (n, 3, 32, 32)
        assert images.is_contiguous()
        assert labels.dtype == torch.int64 and labels.shape == (n,)
        assert torch.bincount(labels, minlength=10).tolist() == [n // 10] * 10
    # Pixels and labels match the source rows, in order (batch 2's first row is sample 20).
    batch2 = cifar_dir[1]["data_batch_2"]
    want = torch.from_numpy(batch2["data"][0].reshape(3, 32, 32))
    assert torch.equal(ds["train_images"][TRAIN_PER_BATCH], want)
    assert ds["train_labels"][TRAIN_PER_BATCH].item() == batch2["labels"][0]
    # A second run reuses the verified cached archive instead of downloading again.
    prepared.prepare(official, out, cache)
    assert server.requests == 1


def test_prepare_balanced_subset(official, tmp_path):
    out = tmp_path / "ds.pt"
    summary = prepared.prepare(official, out, tmp_path / "cache", train_per_class=3, test_per_class=1)
    assert (summary["train"], summary["test"]) == (30, 10)
    ds = prepared.load_dataset(out)
    assert torch.bincount(ds["train_labels"], minlength=10).tolist() == [3] * 10
    assert torch.bincount(ds["test_labels"], minlength=10).tolist() == [1] * 10


# ---------------------------------------------------------------- checksums and retries
def test_corrupt_download_is_retried(official, server, tmp_path):
    server.mode, server.bad_first = "corrupt", 1
    path = fetch.fetch(official, tmp_path / "cache")
    assert server.requests == 2
    assert hashlib.md5(path.read_bytes()).hexdigest() == fetch.CIFAR10_MD5


def test_always_corrupt_download_is_rejected(official, server, tmp_path):
    server.mode, server.bad_first = "corrupt", 99
    cache = tmp_path / "cache"
    with pytest.raises(prepared.DataError, match=fetch.CIFAR10_MD5) as err:
        fetch.fetch(official, cache, retries=3)
    assert "mismatch" in str(err.value) and official in str(err.value)
    assert server.requests == 3
    assert list(cache.iterdir()) == []  # neither the final file nor a .part


def test_truncated_download_is_retried_and_never_kept(server, tmp_path):
    body = bytes(range(256)) * 1000
    server.files["blob.bin"] = body
    server.mode, server.bad_first = "truncate", 1
    cache = tmp_path / "cache"
    assert fetch.fetch(server.url("blob.bin"), cache).read_bytes() == body
    assert server.requests == 2

    server.bad_first = 99
    with pytest.raises(prepared.DataError, match="short read"):
        fetch.fetch(server.url("blob.bin"), tmp_path / "cache2", retries=2)
    assert list((tmp_path / "cache2").iterdir()) == []


def test_sha256_is_verified(server, tmp_path):
    body = b"payload" * 100
    good, wrong = hashlib.sha256(body).hexdigest(), "0" * 64
    server.files["a.tar.gz"] = body
    local = tmp_path / "a.tar.gz"
    local.write_bytes(body)
    assert fetch.fetch(server.url("a.tar.gz"), tmp_path / "c1", sha256=good).read_bytes() == body
    assert fetch.fetch(str(local), tmp_path / "c2", sha256=good) == local  # used in place
    assert fetch.fetch(local.as_uri(), tmp_path / "c2", sha256=good) == local
    with pytest.raises(prepared.DataError, match=wrong):
        fetch.fetch(str(local), tmp_path / "c2", sha256=wrong)
    with pytest.raises(prepared.DataError, match=good):  # message shows the actual digest too
        fetch.fetch(server.url("a.tar.gz"), tmp_path / "c3", sha256=wrong, retries=2)
    assert list((tmp_path / "c3").iterdir()) == []


def test_cached_file_with_bad_checksum_is_replaced(official, server, cifar_tarball, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "cifar-10-python.tar.gz").write_bytes(b"stale")
    path = fetch.fetch(official, cache)
    assert path.read_bytes() == cifar_tarball and server.requests == 1


def test_unreachable_url_names_url_and_fix(tmp_path):
    port = free_port()  # closed again: nothing listens there
    url = f"http://127.0.0.1:{port}/cifar-10-python.tar.gz"
    with pytest.raises(prepared.DataError, match="data.url") as err:
        fetch.fetch(url, tmp_path / "cache", retries=2, timeout_s=5)
    assert url in str(err.value) and "network" in str(err.value)
    # hostile pass WARN: "no network? download the archive elsewhere" of a local server that is down
    assert str(err.value).endswith("the server at 127.0.0.1 runs on this machine: start it, or fix data.url")
    assert fetch._network_fix("https://example.org/c.tar.gz").startswith("no network?")  # noqa: SLF001


def test_a_file_the_server_does_not_have_is_one_attempt_and_not_the_network(server, tmp_path):
    """Final pass H: a 404 was retried three times, then blamed on "no network?"."""
    with pytest.raises(prepared.DataError) as err:
        fetch.fetch(server.url("nothere.tar.gz"), tmp_path / "cache", retries=3)
    assert server.requests == 1, "a 404 was asked for again"
    assert "the server answered HTTP 404 Not Found; fix data.url" in str(err.value), err.value
    assert "network" not in str(err.value)


def test_missing_local_source(tmp_path):
    with pytest.raises(prepared.DataError, match="does not exist"):
        fetch.fetch(str(tmp_path / "nope.tar.gz"), tmp_path / "cache")


# ---------------------------------------------------------------- safe extraction
def _evil_archive(path: Path, evil: tarfile.TarInfo) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        ok = b"harmless"
        info = tarfile.TarInfo("data/ok.txt")
        info.size = len(ok)
        tar.addfile(info, io.BytesIO(ok))
        payload = b"evil" if evil.isreg() else b""
        evil.size = len(payload)
        tar.addfile(evil, io.BytesIO(payload))
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda t: _member("../evil"), "'..'"),
        (lambda t: _member("data/../../evil"), "'..'"),
        (lambda t: _member(str(t / "abs-evil")), "absolute"),
        (lambda t: _member("data/link", tarfile.SYMTYPE, "/etc/passwd"), "link"),
        (lambda t: _member("data/hard", tarfile.LNKTYPE, "data/ok.txt"), "link"),
        (lambda t: _member("data/fifo", tarfile.FIFOTYPE), "not a regular"),
    ],
)
def test_unsafe_archive_is_refused(tmp_path, make, why):
    archive = _evil_archive(tmp_path / "evil.tar.gz", make(tmp_path))
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(prepared.DataError, match=why) as err:
        fetch.safe_extract(archive, work / "dest")
    assert "member" in str(err.value) and "evil.tar.gz" in str(err.value)
    assert _files_in(tmp_path) == {"evil.tar.gz", "work"}  # nothing extracted anywhere


def test_safe_extract_replaces_dest_and_rejects_non_archives(tmp_path, image_folder):
    archive = _tar_gz(tmp_path / "imgs.tgz", image_folder, "mydata")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "stale.txt").write_text("old")
    assert fetch.safe_extract(archive, dest) == dest
    assert not (dest / "stale.txt").exists() and (dest / "mydata" / "train").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "imgs", "imgs.tgz"]
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not an archive")
    with pytest.raises(prepared.DataError, match="junk.tar.gz"):
        fetch.safe_extract(junk, tmp_path / "dest2")
    assert not (tmp_path / "dest2").exists()


# ---------------------------------------------------------------- readers
def _check_image_folder_dataset(ds: dict) -> None:
    assert ds["classes"] == list(prepared.CIFAR10_CLASSES)
    assert ds["train_images"].shape == (40, 3, 32, 32)
    assert ds["test_images"].shape == (30, 3, 32, 32)
    assert ds["train_images"].dtype == torch.uint8 and ds["train_labels"].dtype == torch.int64
    assert torch.bincount(ds["train_labels"], minlength=10).tolist() == [4] * 10
    # PNGs are lossless: value = label * 20 + i (i < 10); the JPEG is label * 20 + 10 (approx.)
    values = ds["train_images"][:, 0, 0, 0].long()
    assert torch.equal((values + 5) // 20, ds["train_labels"])


def test_image_folder_archive_and_directory(server, image_folder, tmp_path):
    archive = _tar_gz(tmp_path / "imgs.tar.gz", image_folder, "mydata")
    server.files["imgs.tar.gz"] = archive.read_bytes()
    summary = prepared.prepare(server.url("imgs.tar.gz"), tmp_path / "a.pt", tmp_path / "cache")
    assert summary == {
        "train": 40,
        "test": 30,
        "classes": list(prepared.CIFAR10_CLASSES),
        "format": "image-folder",
    }
    _check_image_folder_dataset(prepared.load_dataset(tmp_path / "a.pt"))
    prepared.prepare(str(image_folder.parent), tmp_path / "b.pt", tmp_path / "cache")
    _check_image_folder_dataset(prepared.load_dataset(tmp_path / "b.pt"))


def test_image_folder_rejects_bad_trees(image_folder):
    (image_folder / "train" / "bird" / "broken.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(prepared.DataError, match="broken.png") as err:
        prepared.load_image_folder(image_folder)
    # hostile re-run: torchvision's message began with the C++ source path of its build machine
    assert ".cpp" not in str(err.value) and str(err.value).endswith("; re-save it or remove it"), err.value
    (image_folder / "train" / "bird" / "broken.png").unlink()
    (image_folder / "train" / "unicorn").mkdir()
    with pytest.raises(prepared.DataError, match="unicorn"):
        prepared.load_image_folder(image_folder)


def test_own_image_folder_any_size_resized_to_image_size(tmp_path):
    """A user's data set: 3 classes, images of mixed sizes and aspects, resized to data.image_size
    at download; the class count is the folders'."""
    for split in ("train", "test"):
        for i, name in enumerate(("cats", "dogs", "owls")):
            (tmp_path / "own" / split / name).mkdir(parents=True)
            for j, (h, w) in enumerate(((48, 40), (20, 64))):
                img = torch.full((3, h, w), 50 * i, dtype=torch.uint8)
                (tmp_path / "own" / split / name / f"{j}.png").write_bytes(
                    torchvision.io.encode_png(img).numpy().tobytes()
                )
    summary = prepared.prepare(str(tmp_path / "own"), tmp_path / "own.pt", tmp_path / "cache", image_size=24)
    ds = prepared.load_dataset(tmp_path / "own.pt")
    assert summary["classes"] == ["cats", "dogs", "owls"] and ds["num_classes"] == 3
    assert ds["train_images"].shape == (6, 3, 24, 24) and ds["test_images"].shape == (6, 3, 24, 24)
    # resized, not cropped or padded: a uniform image stays uniform at its value
    assert ds["train_images"][ds["train_labels"] == 2].unique().tolist() == [100]


def test_files_that_are_not_images_read_here_are_said_not_passed_over(image_folder, caplog):
    """Hostile pass WARN: BMP, TIFF and GIF files were left out without a word (torchvision's
    make_dataset keeps the suffixes it is given), so a class could be prepared from a few images."""
    for name in ("0001.bmp", "0002.bmp", "0003.tif"):
        (image_folder / "train" / "cat" / name).write_bytes(b"BM not read")
    (image_folder / "train" / "cat" / ".DS_Store").write_bytes(b"finder")  # hidden: not the user's data
    caplog.set_level(logging.WARNING)
    ds = prepared.load_image_folder(image_folder)
    assert len(ds["train_labels"]) == 40  # the PNGs, as before
    said = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(said) == 1, caplog.text  # train/ only: test/ has none
    assert "3 of its 43 files are left out" in said[0] and "2 .bmp, 1 .tif" in said[0], said
    assert "e.g. cat/0001.bmp" in said[0] and said[0].endswith("convert them to PNG to include them")


def test_class_folders_that_differ_are_named_and_one_class_is_refused(tmp_path):
    """Hostile pass WARNs: "train has [10 names], test has [9]" (which one?); a data set of one
    class was prepared and trained (exit 0), every prediction right by construction."""
    png = torchvision.io.encode_png(_image(1)).numpy().tobytes()
    for split, names in (("train", ("ant", "bee", "cat")), ("test", ("ant", "bee", "dog"))):
        for name in names:
            (tmp_path / "a" / split / name).mkdir(parents=True)
            (tmp_path / "a" / split / name / "0.png").write_bytes(png)
    with pytest.raises(prepared.DataError) as err:
        prepared.load_image_folder(tmp_path / "a")
    assert "must hold the same class folders (only in train/: cat; only in test/: dog); add" in str(err.value)
    for split in ("train", "test"):
        (tmp_path / "b" / split / "ant").mkdir(parents=True)
        (tmp_path / "b" / split / "ant" / "0.png").write_bytes(png)
    with pytest.raises(prepared.DataError, match=r"holds one class \(ant\); a classifier needs two or more"):
        prepared.load_image_folder(tmp_path / "b")
    for split in ("train", "test"):  # hostile pass D: torchvision's "Found no valid file ...", no fix
        (tmp_path / "b" / split / "bee").mkdir()
    with pytest.raises(prepared.DataError) as err:
        prepared.load_image_folder(tmp_path / "b")
    assert str(err.value) == (
        f"{tmp_path / 'b' / 'train'}: Found no valid file for the classes bee (PNG, JPEG or WebP); put its "
        "images there, or remove that class folder from train/ and test/"
    )


def test_an_archive_without_a_data_set_is_named_not_its_cache_folder(image_folder, tmp_path):
    """Hostile pass WARN: "no data set found in data/raw/extracted-7def31c5902f", a folder the
    user never made, where the archive they gave holds no test/."""
    import shutil

    shutil.rmtree(image_folder / "test")
    archive = _tar_gz(tmp_path / "no-test.tar.gz", image_folder, "mydata")
    with pytest.raises(prepared.DataError) as err:
        prepared.prepare(str(archive), tmp_path / "a.pt", tmp_path / "cache")
    assert str(err.value).startswith(f"no data set found in {archive} (extracted to {tmp_path / 'cache'}"), (
        err.value
    )


def test_a_class_folder_name_that_is_not_utf8_is_named_with_the_fix(tmp_path):
    """Hostile pass D: a class folder named in Latin-1 (c\\xe9t) gave torchvision's six-line cast
    error ("Unable to cast Python instance ...; re-save it or remove it"): the image was fine."""
    import os

    png = torchvision.io.encode_png(_image(1)).numpy().tobytes()
    for split in ("train", "test"):
        for name in (b"ant", "caf\xe9".encode("latin-1")):
            folder = os.path.join(str(tmp_path).encode(), split.encode(), name)
            os.makedirs(folder)
            with open(os.path.join(folder, b"0.png"), "wb") as f:
                f.write(png)
    with pytest.raises(prepared.DataError) as err:
        prepared.load_image_folder(tmp_path)
    assert "the class folder name 'caf\ufffd' is not UTF-8 text" in str(err.value), err.value
    assert str(err.value).endswith("rename it in train/ and test/ to UTF-8 text")


def test_a_link_to_a_folder_inside_a_class_folder_is_refused(image_folder):
    """Hostile pass E: `train/cat/loopy -> ..` prepared "9,840 images" (240), every class's images
    in cat about 40 times over, exit 0; two such links walked for minutes without a line."""
    loop = image_folder / "train" / "cat" / "loopy"
    loop.symlink_to("..")
    with pytest.raises(prepared.DataError) as err:
        prepared.load_image_folder(image_folder)
    assert str(err.value) == (
        f"{loop} is a link to a folder (..): the images of a class are read from its own folder only; "
        "copy them in, or remove the link"
    )


def test_class_names_with_a_control_character_or_differing_by_case(tmp_path, caplog):
    """Hostile pass E WARNs: a newline in a class folder's name went into the class list; `Cat`
    beside `cat` was not pointed out."""
    png = torchvision.io.encode_png(_image(1)).numpy().tobytes()
    for root, names in (("a", ("ant", "do\ng")), ("b", ("Cat", "cat", "dog"))):
        for split in ("train", "test"):
            for name in names:
                (tmp_path / root / split / name).mkdir(parents=True)
                (tmp_path / root / split / name / "0.png").write_bytes(png)
    with pytest.raises(prepared.DataError, match=r"the class folder name 'do\\ng' holds a control character"):
        prepared.load_image_folder(tmp_path / "a")
    caplog.set_level(logging.WARNING)
    assert prepared.load_image_folder(tmp_path / "b")["classes"] == ["Cat", "cat", "dog"]
    assert "class folders differ only by case: Cat, cat (kept apart, as named)" in caplog.text


def test_image_folder_other_classes_sorted(tmp_path):
    for split in ("train", "test"):
        for i, name in enumerate(("zebra", "ant")):
            (tmp_path / split / name).mkdir(parents=True)
            png = torchvision.io.encode_png(_image(i)).numpy().tobytes()
            (tmp_path / split / name / "0.png").write_bytes(png)
    ds = prepared.load_image_folder(tmp_path)
    assert ds["classes"] == ["ant", "zebra"]
    assert ds["train_labels"].tolist() == [0, 1]
    assert ds["train_images"][:, 0, 0, 0].tolist() == [1, 0]  # ant was written with value 1


def test_a_thousand_class_names_make_lines_of_a_screen_not_pages(tmp_path, caplog):
    """Hostile pass H: 1000 classes gave a warning of 7,201 characters and a "wrote" line of 9,153,
    each naming every class."""
    png = torchvision.io.encode_png(_image(3, size=8)).numpy().tobytes()
    for split in ("train", "test"):
        for i in range(1000):
            (tmp_path / "imgs" / split / f"c{i:04d}").mkdir(parents=True)
            (tmp_path / "imgs" / split / f"c{i:04d}" / "0.png").write_bytes(png)
    caplog.set_level(logging.INFO)
    prepared.prepare(str(tmp_path / "imgs"), tmp_path / "ds.pt", tmp_path / "cache")
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("ampbench")]
    assert lines and max(len(line) for line in lines) < 600, [len(line) for line in lines]
    said = "\n".join(lines)
    assert "holds 1000 classes, not CIFAR-10's 10: c0000, c0001," in said and "... and 980 more" in said
    assert prepared.load_dataset(tmp_path / "ds.pt")["classes"][-1] == "c0999"  # all kept


def test_corrupt_cifar_batch_is_not_unpickled(cifar_dir, tmp_path):
    root = cifar_dir[0]
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (root / "cifar-10-batches-py" / "data_batch_3").write_bytes(pickle.dumps(Exploit()))
    with pytest.raises(prepared.DataError, match="data_batch_3"):
        prepared.load_cifar_python(root)
    assert not marker.exists()


def test_find_dataset_root(tmp_path, cifar_dir, image_folder):
    assert prepared.find_dataset_root(cifar_dir[0]) == ("cifar-python", cifar_dir[0])
    assert prepared.find_dataset_root(tmp_path / "imgs") == ("image-folder", image_folder)
    empty = tmp_path / "empty" / "x" / "y" / "z"
    empty.mkdir(parents=True)
    (empty / "train").mkdir()
    (empty / "test").mkdir()  # 3 levels down: too deep
    with pytest.raises(prepared.DataError, match="cifar-10-batches-py") as err:
        prepared.find_dataset_root(tmp_path / "empty")
    assert "x/y" in str(err.value)


# ---------------------------------------------------------------- subsets and files
def test_balanced_subset():
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 2, 2, 1, 0])
    images = torch.arange(10)
    sub_images, sub_labels = prepared.balanced_subset(images, labels, 2)
    assert sub_images.tolist() == [0, 1, 2, 3, 4, 6]
    assert sub_labels.tolist() == [0, 1, 0, 2, 1, 2]
    assert prepared.balanced_subset(images, labels, 0)[0].tolist() == list(range(10))
    with pytest.raises(prepared.DataError) as err:
        prepared.balanced_subset(images, labels, 4, "test", ["cat", "dog", "ship"])
    # hostile pass P: "class 0 has 24 samples, fewer than the 100 asked" (no name, setting or fix)
    assert str(err.value) == (
        "data.test_per_class=4 asks for 4 test images per class, but class 'dog' has 3 (2 classes have "
        "fewer): set data.test_per_class to at most 3, or 0 for every image"
    )


def test_save_and_load_dataset(tmp_path):
    with pytest.raises(prepared.DataError, match="ampbench download"):
        prepared.load_dataset(tmp_path / "missing.pt")
    ds = {
        "train_images": torch.zeros(4, 3, 32, 32, dtype=torch.uint8),
        "train_labels": torch.arange(4),
        "test_images": torch.ones(2, 3, 32, 32, dtype=torch.uint8),
        "test_labels": torch.arange(2),
        "classes": ["a", "b", "c", "d"],
    }
    prepared.save_dataset(ds, tmp_path / "sub" / "ds.pt")
    # no temp file left; the digest recorded beside the file
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["ds.pt", "ds.pt.sha256"]
    back = prepared.load_dataset(tmp_path / "sub" / "ds.pt", device="cpu")
    assert back["classes"] == ds["classes"] and torch.equal(back["test_images"], ds["test_images"])
    (tmp_path / "bad.pt").write_bytes(b"garbage")
    with pytest.raises(prepared.DataError, match=r"unreadable .*delete it and run `ampbench download` again"):
        prepared.load_dataset(tmp_path / "bad.pt")


def test_recorded_digest_is_used_only_while_the_file_is_unchanged(tmp_path):
    path = tmp_path / "ds.pt"
    prepared.save_dataset({"x": torch.arange(10)}, path)
    true = hashlib.sha256(path.read_bytes()).hexdigest()
    assert prepared.file_digest(path) == true
    record = path.with_name("ds.pt.sha256")
    faked = json.loads(record.read_text()) | {"sha256": "f" * 64}
    record.write_text(json.dumps(faked))
    assert prepared.file_digest(path) == "f" * 64  # the record is what is read while it is newer
    time.sleep(0.01)
    path.write_bytes(path.read_bytes()[::-1])  # an edit of the same size: the file is newer
    assert prepared.file_digest(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    record.write_text(json.dumps(faked))
    path.write_bytes(path.read_bytes() + b"x")  # an edit: size and mtime change
    assert prepared.file_digest(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    record.write_text("{torn")
    assert prepared.file_digest(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_same_data_saved_again_is_the_same_bytes(tmp_path):
    """Hostile pass G: `dvc repro -f download` of the same source made every train stage stale
    ("modified: data/prepared"): the digest record beside the data held its modification time."""
    ds = {"train_images": torch.arange(12, dtype=torch.uint8), "classes": ["a", "b"]}
    prepared.save_dataset(ds, tmp_path / "prepared" / "cifar10.pt")
    first = {p.name: p.read_bytes() for p in (tmp_path / "prepared").iterdir()}
    time.sleep(0.01)
    prepared.save_dataset(ds, tmp_path / "prepared" / "cifar10.pt")
    assert {p.name: p.read_bytes() for p in (tmp_path / "prepared").iterdir()} == first
    assert sorted(first) == ["cifar10.pt", "cifar10.pt.sha256"]


# ---------------------------------------------------------------- issue #13 items 6 and 12
def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # exited and reaped: a pid nobody holds (until the kernel reuses it)


def test_temporaries_of_a_killed_download_are_removed_by_the_next(server, image_folder, tmp_path):
    """kill -9 of `ampbench download` leaves temps (one inside the DVC output data/prepared)."""
    archive = _tar_gz(tmp_path / "imgs.tar.gz", image_folder, "mydata")
    server.files["imgs.tar.gz"] = archive.read_bytes()
    url, cache, out = server.url("imgs.tar.gz"), tmp_path / "raw", tmp_path / "prepared"
    prepared.prepare(url, out / "cifar10.pt", cache)
    dead, extracted = _dead_pid(), next(p.name for p in cache.iterdir() if p.name.startswith("extracted-"))
    stale = [
        out / f".cifar10.pt.tmp-{dead}",
        out / "cifar10.pt.k2j4_x9a.tmp",  # older naming
        cache / f".imgs.tar.gz.part-{dead}-abc",
        cache / "imgs.tar.gz.q1w2e3r4.part",
        cache / f".{extracted}.extracting-{dead}-abc",
        cache / f".{extracted}.extracting-q1w2e3r4",
        cache / f".{extracted}.old-{dead}-abc",
    ]
    for path in stale:
        if "extracting" in path.name or ".old-" in path.name:
            (path / "train").mkdir(parents=True)
        else:
            path.write_bytes(b"half written")
    live = out / f".cifar10.pt.tmp-{os.getppid()}"  # a writer that is still running: keep
    live.write_bytes(b"being written")
    prepared.prepare(url, out / "cifar10.pt", cache)
    assert [p for p in stale if p.exists()] == []
    assert live.exists()
    assert prepared.load_dataset(out / "cifar10.pt")["train_images"].shape[0] == 40


def test_save_dataset_makes_the_rename_durable(tmp_path, monkeypatch):
    """The same atomic write as checkpoints: the folder is fsync'ed after the rename."""
    import stat

    synced = []
    real_fsync = os.fsync

    def record(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", record)
    prepared.save_dataset({"classes": ["a"]}, tmp_path / "ds.pt")
    assert synced == [False, True, False]  # the file, then its folder; then the digest file beside it


def _class_tree(root: Path, names: list[str]) -> Path:
    for split in ("train", "test"):
        for i, name in enumerate(names):
            (root / split / name).mkdir(parents=True)
            png = torchvision.io.encode_png(_image(i)).numpy().tobytes()
            (root / split / name / "0.png").write_bytes(png)
    return root


@pytest.mark.parametrize("count", [9, 11])
def test_image_folder_without_ten_classes_warns_and_records_the_count(tmp_path, caplog, count):
    names = [*prepared.CIFAR10_CLASSES, "unicorn"][:count]
    root = _class_tree(tmp_path / "tree", names)
    with caplog.at_level("WARNING", logger="ampbench.data.prepared"):
        prepared.prepare(str(root), tmp_path / "cifar10.pt", tmp_path / "cache")
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert f"{count} classes" in warning and str(root) in warning and names[-1] in warning, warning
    assert prepared.load_dataset(tmp_path / "cifar10.pt")["num_classes"] == count


@pytest.mark.slow
def test_download_records_the_class_count_in_source_json(project, tmp_path):
    import json

    from conftest import run_cli

    root = _class_tree(tmp_path / "tree", list(prepared.CIFAR10_CLASSES)[:9])
    proc = run_cli(project, "download", "--set", f"data.url={root}", "--set", "data.train_per_class=0")
    assert "9 classes" in proc.stderr
    assert json.loads((project / "data" / "prepared" / "source.json").read_text())["num_classes"] == 9


def test_a_quick_variants_shortfall_names_the_parameter_that_fixes_it(monkeypatch):
    """Hostile pass T: under `mlflow run -P quick=yes` the fix "set data.test_per_class to at most 3"
    could not be followed (quick's 100 overrides params.yaml) and MLproject had no such parameter."""
    from ampbench.cli_options import VARIANT_OPTIONS

    monkeypatch.setenv("AMPBENCH_SCOPE", "variant")
    labels = torch.tensor([0, 1, 0, 1, 0, 1])
    with pytest.raises(prepared.DataError) as err:
        prepared.balanced_subset(torch.arange(6), labels, 100, "test", ["cat", "dog"])
    assert str(err.value).endswith(
        "give `mlflow run` -P test_per_class=3 (`ampbench variant` --test-per-class 3), or 0 for every image"
    )
    assert ("--test-per-class", "data.test_per_class") in [(flag, key) for flag, key, _ in VARIANT_OPTIONS]


def test_a_quick_variants_too_short_schedule_names_its_parameters(monkeypatch):
    """Hostile pass U: under `mlflow run -P quick=yes` "raise train.epochs or lower
    train.batch_size" named settings that quick's own override: the -P parameters are named too."""
    from ampbench.config import ConfigError
    from ampbench.training import loader

    data = {"train_labels": torch.zeros(40, dtype=torch.long)}
    with pytest.raises(ConfigError) as plain:
        loader.check_batch(20, data, epochs=1)
    assert "mlflow run" not in str(plain.value)
    monkeypatch.setenv("AMPBENCH_SCOPE", "variant")
    with pytest.raises(ConfigError) as quick:
        loader.check_batch(20, data, epochs=1)
    assert str(quick.value).endswith(
        "raise train.epochs or lower train.batch_size (`mlflow run`: -P epochs=, -P batch_size=)"
    )
