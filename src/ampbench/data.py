"""Fetch, verify, unpack and convert the image data set into one tensor file that training loads.

``prepare`` is the whole download stage: it fetches the source (the official CIFAR-10 URL, any
http(s) or file:// URL, a local archive or a local folder), verifies checksums, extracts archives
without trusting their member paths, reads either the CIFAR python batches or an ImageFolder tree
(``train/<class>/*.png|jpg`` and ``test/<class>/*``) and writes a dict of uint8/int64 tensors:

    summary = prepare(CIFAR10_URL, Path("data/cifar10.pt"), Path("data/cache"), train_per_class=100)
    ds = load_dataset(Path("data/cifar10.pt"), device="cuda")  # {"train_images": (N,3,32,32), ...}

Every failure raises ``DataError`` whose message says what went wrong, where, and how to fix it.
Nothing partial is ever left at a final path: downloads, extractions and saves go to a temporary
name in the same folder and are renamed into place only once complete and verified.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import shutil
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
import warnings
from pathlib import Path, PurePosixPath, PureWindowsPath

import torch
from tqdm import tqdm

from ampbench import checkpoint

# torchvision is imported where it is used (download / prepare only): importing it pulls in
# torch._dynamo, seconds that every train and evaluate stage would pay just to load the data.

log = logging.getLogger(__name__)

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp")
_BACKOFF_S = 0.5  # sleep _BACKOFF_S * attempt between download attempts; tests set it to 0
_CHUNK = 1 << 20
_NO_NETWORK_FIX = (
    "no network? download the archive elsewhere and point data.url at the local file, e.g. "
    "`dvc exp run -S data.url=/path/to/cifar-10-python.tar.gz` or "
    "`make run DATA=/path/to/cifar-10-python.tar.gz`"
)


class DataError(Exception):
    """Bad data source or archive; the message says what, where and how to fix."""


class _AttemptFailed(Exception):
    """One download attempt failed in a way worth retrying; `fix` is the hint for the user."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(reason)
        self.fix = fix


def _hashers(source: str, sha256: str) -> dict[str, tuple]:
    """Name -> (hash object, expected hex digest) for every checksum that applies to `source`."""
    wanted = {"md5": (hashlib.md5(), CIFAR10_MD5)} if source == CIFAR10_URL else {}
    if sha256:
        wanted["sha256"] = (hashlib.sha256(), sha256.lower())
    return wanted


def _mismatch(hashers: dict[str, tuple]) -> str:
    """Empty if every digest matches, else a message naming expected and actual digests."""
    actual = {name: h.hexdigest() for name, (h, _) in hashers.items()}
    expected = {name: want for name, (_, want) in hashers.items()}
    bad = [f"{n} expected {expected[n]}, got {d}" for n, d in actual.items() if d != expected[n]]
    return "checksum mismatch: " + "; ".join(bad) if bad else ""


def _verify_file(path: Path, source: str, sha256: str) -> str:
    hashers = _hashers(source, sha256)
    with open(path, "rb") as f:
        while hashers and (chunk := f.read(_CHUNK)):
            for h, _ in hashers.values():
                h.update(chunk)
    return _mismatch(hashers)


def fetch(
    source: str, cache_dir: Path, *, sha256: str = "", retries: int = 3, timeout_s: float = 60.0
) -> Path:
    """Return a local, verified path for `source` (http(s)/file:// URL, archive file or folder).

    Local files are used in place (sha256-checked if given); folders are returned as is. URLs are
    downloaded into `cache_dir`, verified while streaming and renamed into place only when whole.
    """
    parsed = urllib.parse.urlparse(source)
    if parsed.scheme in ("http", "https"):
        return _download(source, Path(cache_dir), sha256, max(retries, 1), timeout_s)
    local = urllib.request.url2pathname(parsed.path) if parsed.scheme == "file" else source
    path = Path(local).expanduser()
    if not path.exists():
        raise DataError(f"data source {source!r} does not exist; fix data.url")
    if path.is_file() and (problem := _verify_file(path, source, sha256)):
        raise DataError(f"{path}: {problem}; fix data.sha256 or replace the file")
    return path


def _download(url: str, cache_dir: Path, sha256: str, attempts: int, timeout_s: float) -> Path:
    cache_dir.mkdir(parents=True, exist_ok=True)
    final = cache_dir / (PurePosixPath(urllib.parse.urlparse(url).path).name or "download")
    # Without a checksum a cached copy can't be shown to be this URL's content: download again.
    if final.is_file() and _hashers(url, sha256) and not _verify_file(final, url, sha256):
        log.info("using cached %s (checksum ok)", final)
        return final
    for attempt in range(1, attempts + 1):
        try:
            _download_once(url, final, sha256, timeout_s)
            return final
        except _AttemptFailed as exc:
            error = exc
            log.warning("download %s failed (attempt %d/%d): %s", url, attempt, attempts, exc)
            if attempt < attempts:
                time.sleep(_BACKOFF_S * attempt)
    raise DataError(f"could not download {url} after {attempts} attempt(s): {error}; {error.fix}")


def _download_once(url: str, final: Path, sha256: str, timeout_s: float) -> None:
    """Stream `url` to a temp file next to `final`; rename into place only if whole and verified."""
    hashers, got = _hashers(url, sha256), 0
    _remove_stale(final, "part", legacy=f"{final.name}.*.part")
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=checkpoint.temp_name(final, "part") + "-")
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                    size = int(resp.headers.get("Content-Length") or -1)
                    total = size if size >= 0 else None
                    with tqdm(total=total, unit="B", unit_scale=True, desc=final.name) as bar:
                        while chunk := resp.read(_CHUNK):
                            out.write(chunk)
                            for h, _ in hashers.values():
                                h.update(chunk)
                            got += len(chunk)
                            bar.update(len(chunk))
            except (OSError, http.client.HTTPException) as exc:  # URLError is an OSError
                raise _AttemptFailed(f"network error: {exc}", _NO_NETWORK_FIX) from exc
            if size >= 0 and got != size:
                raise _AttemptFailed(f"short read: got {got} of {size} bytes", _NO_NETWORK_FIX)
            if problem := _mismatch(hashers):
                raise _AttemptFailed(problem, "check data.url and data.sha256, or retry later")
            out.flush()
            os.fsync(out.fileno())  # bytes must be on disk before the final name says "complete"
        os.replace(tmp, final)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _check_member(member: tarfile.TarInfo, archive: Path) -> None:
    name = member.name
    if name.startswith(("/", "\\")) or PureWindowsPath(name).drive:
        problem = "has an absolute path"
    elif ".." in PurePosixPath(name.replace("\\", "/")).parts:
        problem = "contains '..'"
    elif member.issym() or member.islnk():
        problem = f"is a link (to {member.linkname!r})"
    elif not (member.isreg() or member.isdir()):  # devices, fifos and anything exotic
        problem = "is not a regular file or folder"
    else:
        return
    raise DataError(f"refusing archive {archive}: member {name!r} {problem}; use a trusted archive")


def safe_extract(archive: Path, dest: Path) -> Path:
    """Extract a tar/tar.gz/tgz into `dest`, refusing unsafe members; all or nothing, atomically."""
    archive, dest = Path(archive), Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    for kind in ("extracting", "old"):
        _remove_stale(dest, kind)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=checkpoint.temp_name(dest, "extracting") + "-"))
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for member in members:  # check everything before writing anything
                _check_member(member, archive)
            # filter="data" is a second line of defence should the checks above miss something.
            bar = tqdm(members, desc=f"extract {archive.name}", unit="file")
            tar.extractall(tmp, members=bar, filter="data")
        if dest.exists():  # move the old copy aside atomically so dest is never half-deleted
            old = Path(tempfile.mkdtemp(dir=dest.parent, prefix=checkpoint.temp_name(dest, "old") + "-"))
            os.replace(dest, old / dest.name)
            shutil.rmtree(old)
        os.replace(tmp, dest)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise DataError(f"cannot extract {archive}: {exc}; is it a complete tar/tar.gz?") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _bundle(train_images, train_labels, test_images, test_labels, classes) -> dict:
    return {
        "train_images": train_images.contiguous(),
        "train_labels": torch.as_tensor(train_labels, dtype=torch.int64),
        "test_images": test_images.contiguous(),
        "test_labels": torch.as_tensor(test_labels, dtype=torch.int64),
        "classes": [str(c) for c in classes],
        "num_classes": len(classes),  # recorded: the file is called cifar10.pt whatever it holds
    }


def _remove_stale(path: Path, kind: str, legacy: str = "") -> None:
    """Temporaries of a killed writer; `legacy`: the glob of older versions' names (no pid in them)."""
    checkpoint.remove_stale_temps(path, kind)
    for stale in path.parent.glob(legacy) if legacy else ():
        stale.unlink(missing_ok=True)


def _warn_class_count(root: Path, classes) -> None:
    """An ImageFolder that is not 10 classes is trained as is; say so, so that nobody compares it
    with CIFAR-10 results by mistake (a class folder lost or added while copying, say)."""
    if len(classes) != len(CIFAR10_CLASSES):
        log.warning(
            "%s holds %d classes, not CIFAR-10's %d: %s; the prepared file holds these %d classes "
            "(fix data.url if that is not what you meant)",
            root, len(classes), len(CIFAR10_CLASSES), ", ".join(classes), len(classes),
        )  # fmt: skip


def load_cifar_python(root: Path) -> dict:
    """Read `root/cifar-10-batches-py/`; torchvision MD5-checks each file before unpickling it."""
    import torchvision
    from torchvision.datasets.utils import check_integrity

    cls = torchvision.datasets.CIFAR10
    try:
        train, test = (cls(str(root), train=t, download=False) for t in (True, False))
    except RuntimeError as exc:  # integrity check failed: nothing was unpickled
        files = [*cls.train_list, *cls.test_list, [cls.meta["filename"], cls.meta["md5"]]]
        folder = Path(root, cls.base_folder)
        bad = [name for name, md5 in files if not check_integrity(str(folder / name), md5)]
        raise DataError(
            f"{folder}: missing or corrupted {bad or exc}; "
            "re-download the official archive (delete the cache) or fix data.url"
        ) from exc
    as_chw = [torch.from_numpy(d.data).permute(0, 3, 1, 2) for d in (train, test)]  # stored NHWC
    return _bundle(as_chw[0], train.targets, as_chw[1], test.targets, train.classes)


def _class_names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.is_dir()} if folder.is_dir() else set()


def _decode_split(folder: Path, class_to_idx: dict[str, int]) -> tuple[torch.Tensor, list[int]]:
    import torchvision
    from torchvision.datasets.folder import make_dataset

    try:
        samples = make_dataset(str(folder), class_to_idx, extensions=IMAGE_EXTENSIONS)
    except FileNotFoundError as exc:
        raise DataError(f"{folder}: {exc}") from exc
    images = torch.empty((len(samples), 3, 32, 32), dtype=torch.uint8)
    rgb = torchvision.io.ImageReadMode.RGB
    # torchvision deprecates its image io in favour of torchcodec (not a dependency here).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for i, (path, _) in enumerate(tqdm(samples, desc=f"decode {folder.name}", unit="img")):
            try:
                img = torchvision.io.decode_image(torchvision.io.read_file(path), mode=rgb)
            except RuntimeError as exc:
                raise DataError(f"cannot decode image {path}: {exc}") from exc
            if img.shape != (3, 32, 32) or img.dtype != torch.uint8:
                raise DataError(f"image {path} is {tuple(img.shape)} {img.dtype}; need 32x32 8-bit")
            images[i] = img
    return images, [label for _, label in samples]


def load_image_folder(root: Path) -> dict:
    """Read `root/train/<class>/*` and `root/test/<class>/*` as uint8 RGB 32x32 images."""
    root = Path(root)
    train_classes, test_classes = _class_names(root / "train"), _class_names(root / "test")
    if not train_classes or train_classes != test_classes:
        raise DataError(
            f"{root}: train/ and test/ must hold the same class folders; train has "
            f"{sorted(train_classes)}, test has {sorted(test_classes)}"
        )
    classes = CIFAR10_CLASSES if train_classes == set(CIFAR10_CLASSES) else sorted(train_classes)
    _warn_class_count(root, classes)
    class_to_idx = {name: i for i, name in enumerate(classes)}
    train_images, train_labels = _decode_split(root / "train", class_to_idx)
    test_images, test_labels = _decode_split(root / "test", class_to_idx)
    return _bundle(train_images, train_labels, test_images, test_labels, classes)


def find_dataset_root(extracted: Path) -> tuple[str, Path]:
    """Return ('cifar-python' | 'image-folder', dir) found at most 2 levels below `extracted`."""
    level, seen = [Path(extracted)], []
    for depth in range(3):  # the folder itself, its children, its grandchildren
        for d in level:
            if (d / "cifar-10-batches-py").is_dir():
                return "cifar-python", d
            if (d / "train").is_dir() and (d / "test").is_dir():
                return "image-folder", d
        if depth < 2:  # listing deeper would only walk image files for nothing
            level = [c for d in level for c in sorted(d.iterdir()) if c.is_dir()]
            seen += [c.relative_to(extracted).as_posix() for c in level]
    raise DataError(
        f"no data set found in {extracted} (searched 2 levels; folders: {seen[:20] or 'none'}); "
        "expected cifar-10-batches-py/ (CIFAR python format) or train/<class>/ + test/<class>/"
    )


def balanced_subset(images: torch.Tensor, labels: torch.Tensor, per_class: int) -> tuple:
    """The first `per_class` samples of every class, in original order; 0 keeps everything."""
    if per_class < 0:
        raise DataError(f"per_class must be >= 0, got {per_class}")
    if per_class == 0:
        return images, labels
    keep = []
    for c in labels.unique().tolist():
        idx = (labels == c).nonzero().flatten()
        if len(idx) < per_class:
            raise DataError(f"class {c} has {len(idx)} samples, fewer than the {per_class} asked")
        keep.append(idx[:per_class])
    order = torch.cat(keep).sort().values  # restore the original interleaving of classes
    return images[order].contiguous(), labels[order]


def prepare(
    source: str,
    out_file: Path,
    cache_dir: Path,
    *,
    sha256: str = "",
    retries: int = 3,
    timeout_s: float = 60.0,
    train_per_class: int = 0,
    test_per_class: int = 0,
) -> dict:
    """Fetch, extract, read, subset and save the data set; return a summary of what was written."""
    cache_dir = Path(cache_dir)
    local = fetch(source, cache_dir, sha256=sha256, retries=retries, timeout_s=timeout_s)
    if local.is_file():
        tag = hashlib.sha256(source.encode()).hexdigest()[:12]
        local = safe_extract(local, cache_dir / f"extracted-{tag}")
    fmt, root = find_dataset_root(local)
    ds = load_cifar_python(root) if fmt == "cifar-python" else load_image_folder(root)
    for split, n in (("train", train_per_class), ("test", test_per_class)):
        ds[f"{split}_images"], ds[f"{split}_labels"] = balanced_subset(
            ds[f"{split}_images"], ds[f"{split}_labels"], n
        )
    save_dataset(ds, Path(out_file))
    summary = {
        "train": len(ds["train_labels"]),
        "test": len(ds["test_labels"]),
        "classes": ds["classes"],
        "format": fmt,
    }
    log.info("wrote %s: %s", out_file, summary)
    return summary


def save_dataset(ds: dict, path: Path) -> None:
    """Atomically (checkpoint.atomic_save: temp file, fsync, rename, folder fsync), clearing stale temps."""
    path = Path(path)
    for legacy in path.parent.glob(f"{path.name}.*.tmp"):  # older versions' temps (no pid in the name)
        legacy.unlink(missing_ok=True)
    try:
        checkpoint.atomic_save(ds, path)  # removes its own stale temps of dead writers first
    except OSError as exc:
        raise DataError(
            f"could not write {path}: {exc.strerror}; check the free space and permissions of "
            f"{path.parent}, then re-run `ampbench download`"
        ) from exc


def load_dataset(path: Path, device: torch.device | str | None = None) -> dict:
    """Load a file written by `save_dataset`; tensors are moved to `device` if given."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} not found; run `ampbench download` / `dvc repro download` first")
    try:
        ds = torch.load(path, map_location="cpu", weights_only=True)  # weights_only: no pickle code
    except Exception as exc:  # torch raises many types for a damaged file
        raise DataError(f"{path} is unreadable ({exc}); delete it and re-download") from exc
    keys = set(ds) if isinstance(ds, dict) else set()
    missing = {"train_images", "train_labels", "test_images", "test_labels", "classes"} - keys
    if missing:
        raise DataError(f"{path} lacks {sorted(missing)}; re-run `ampbench download`")
    if device is not None:
        ds = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in ds.items()}
    return ds


def file_digest(path: Path) -> str:
    """sha256 of a file (the prepared data's identity in MLflow's Dataset column)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()
