"""Read an image data set's formats and keep it as one tensor file that training loads.

``prepare`` is the whole download stage: ``ampbench.data.fetch`` gets the source onto disk (verified,
extracted); this module reads either the CIFAR python batches or an ImageFolder tree
(``train/<class>/*.png|jpg`` and ``test/<class>/*``), takes the configured per-class subset and
writes a dict of uint8/int64 tensors atomically:

    summary = prepare(CIFAR10_URL, Path("data/cifar10.pt"), Path("data/cache"), train_per_class=100)
    ds = load_dataset(Path("data/cifar10.pt"), device="cuda")  # {"train_images": (N,3,32,32), ...}

Every failure raises ``DataError`` (``ampbench.data.fetch``, importable from here too) saying what
went wrong, where, and how to fix it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import warnings
from pathlib import Path

import torch
from tqdm import tqdm

from ampbench import atomic
from ampbench.chains import reason
from ampbench.data import download_lines, image_files, resize
from ampbench.data.fetch import CHUNK, CIFAR10_URL, DataError, fetch, safe_extract
from ampbench.data.subset import balanced_subset

# torchvision is imported where it is used (download / prepare only): importing it pulls in
# torch._dynamo, seconds that every train and evaluate stage would pay just to load the data.

__all__ = [
    "CIFAR10_CLASSES",
    "CIFAR10_URL",
    "DataError",
    "balanced_subset",
    "fetch",
    "file_digest",
    "find_dataset_root",
    "load_cifar_python",
    "load_dataset",
    "load_image_folder",
    "prepare",
    "safe_extract",
    "save_dataset",
]

log = logging.getLogger(__name__)

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def _bundle(train_images, train_labels, test_images, test_labels, classes) -> dict:
    return {
        "train_images": train_images.contiguous(),
        "train_labels": torch.as_tensor(train_labels, dtype=torch.int64),
        "test_images": test_images.contiguous(),
        "test_labels": torch.as_tensor(test_labels, dtype=torch.int64),
        "classes": [str(c) for c in classes],
        "num_classes": len(classes),  # recorded: the file is called cifar10.pt whatever it holds
    }


def _warn_class_count(root: Path, classes) -> None:
    """An ImageFolder that is not 10 classes is trained as is; say so, so that nobody compares it
    with CIFAR-10 results by mistake (a class folder lost or added while copying, say)."""
    if len(classes) != len(CIFAR10_CLASSES):
        log.warning(
            "%s holds %d classes, not CIFAR-10's %d: %s; the prepared file holds these %d classes "
            "(fix data.url if that is not what you meant)",
            root,
            len(classes),
            len(CIFAR10_CLASSES),
            named(classes),
            len(classes),
        )


NAMED_CLASSES = 20  # in a line: a data set of 1000 classes made lines of 7,000-9,000 characters


def named(classes) -> str:
    """The class names, the first NAMED_CLASSES of them in a line that says how many more."""
    classes = [str(c) for c in classes]
    more = len(classes) - NAMED_CLASSES
    return ", ".join(classes[:NAMED_CLASSES]) + (f", ... and {more:,} more" if more > 0 else "")


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


def _decode_split(folder: Path, class_to_idx: dict[str, int], size: int) -> tuple[torch.Tensor, list[int]]:
    import torchvision

    try:
        samples = image_files.samples(folder, class_to_idx)
    except FileNotFoundError as exc:  # torchvision: "Found no valid file for the classes dog. ..."
        raise DataError(
            f"{folder}: {str(exc).split('. ')[0]} (PNG, JPEG or WebP); put its images there, or remove "
            "that class folder from train/ and test/"
        ) from exc
    images = torch.empty((len(samples), 3, size, size), dtype=torch.uint8)
    rgb = torchvision.io.ImageReadMode.RGB
    # torchvision deprecates its image io in favour of torchcodec (not a dependency here).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        lines = download_lines.counted(samples, f"decoding {folder}/", "images")  # where no bar is drawn
        for i, (path, _) in enumerate(
            tqdm(lines, f"decode {folder.name}", len(samples), unit="img", disable=None)
        ):
            try:
                img = torchvision.io.decode_image(torchvision.io.read_file(path), mode=rgb)
            except RuntimeError as exc:  # torch's message starts with its C++ source path: not ours
                why = str(exc).rsplit(".cpp:", 1)[-1].lstrip("0123456789, ").split(". ")[0]
                raise DataError(f"cannot decode image {path}: {why}; re-save it or remove it") from exc
            if img.dtype != torch.uint8:
                raise DataError(f"image {path} is {img.dtype}; need 8-bit (re-save it as 8-bit PNG or JPEG)")
            images[i] = resize.square(img, size)
    return images, [label for _, label in samples]


def load_image_folder(root: Path, size: int = 32) -> dict:
    """Read `root/train/<class>/*` and `root/test/<class>/*` as uint8 RGB images, each resized to
    size x size (data.image_size); the classes are the folders' names, as many as there are."""
    root = Path(root)
    train_classes, test_classes = _class_names(root / "train"), _class_names(root / "test")
    image_files.check_classes(root, train_classes, test_classes)
    classes = CIFAR10_CLASSES if train_classes == set(CIFAR10_CLASSES) else sorted(train_classes)
    _warn_class_count(root, classes)
    class_to_idx = {name: i for i, name in enumerate(classes)}
    train_images, train_labels = _decode_split(root / "train", class_to_idx, size)
    test_images, test_labels = _decode_split(root / "test", class_to_idx, size)
    return _bundle(train_images, train_labels, test_images, test_labels, classes)


def find_dataset_root(extracted: Path, source: str = "") -> tuple[str, Path]:
    """Return ('cifar-python' | 'image-folder', dir) found at most 2 levels below `extracted`
    (``source``: what it was extracted from, named in the refusal rather than the cache folder)."""
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
    where = f"{source} (extracted to {extracted})" if source and str(extracted) != source else extracted
    raise DataError(
        f"no data set found in {where} (searched 2 levels; folders: {seen[:20] or 'none'}); "
        "expected cifar-10-batches-py/ (CIFAR python format) or train/<class>/ + test/<class>/"
    )


def prepare(
    source: str,
    out_file: Path,
    cache_dir: Path,
    *,
    train_per_class: int = 0,
    test_per_class: int = 0,
    image_size: int = 32,
    **download,
) -> dict:
    """Fetch, extract, read, subset and save the data set; return a summary of what was written.

    `download`: fetch's keywords (sha256, retries, timeout_s, min_rate_kib_s)."""
    cache_dir = Path(cache_dir)
    local = fetch(source, cache_dir, **download)
    if local.is_file():
        tag = hashlib.sha256(source.encode()).hexdigest()[:12]
        local = safe_extract(local, cache_dir / f"extracted-{tag}")
    fmt, root = find_dataset_root(local, source)
    ds = load_cifar_python(root) if fmt == "cifar-python" else load_image_folder(root, image_size)
    for split in ("train", "test"):  # CIFAR's 32x32, for a model that wants larger images
        ds[f"{split}_images"] = resize.square(ds[f"{split}_images"], image_size)
    for split, n in (("train", train_per_class), ("test", test_per_class)):
        ds[f"{split}_images"], ds[f"{split}_labels"] = balanced_subset(
            ds[f"{split}_images"], ds[f"{split}_labels"], n, split, ds["classes"]
        )
    save_dataset(ds, Path(out_file))
    summary = {
        "train": len(ds["train_labels"]),
        "test": len(ds["test_labels"]),
        "classes": ds["classes"],
        "format": fmt,
    }
    log.info("wrote %s: %s", out_file, {**summary, "classes": f"[{named(ds['classes'])}]"})
    return summary


def save_dataset(ds: dict, path: Path) -> None:
    """Atomically (atomic.atomic_save: temp file, fsync, rename, folder fsync), clearing stale temps."""
    path = Path(path)
    for legacy in path.parent.glob(f"{path.name}.*.tmp"):  # older versions' temps (no pid in the name)
        legacy.unlink(missing_ok=True)
    try:
        atomic.atomic_save(ds, path)  # removes its own stale temps of dead writers first
        # what DVC hashes as the stage's output: nothing in it may differ between two runs of
        # the same data (hostile pass G: a modification time here made every train stage stale)
        record = {"sha256": _sha256(path), "size": path.stat().st_size}
        atomic.atomic_write_text(_digest_file(path), json.dumps(record) + "\n")
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
        # weights_only: no pickle code; mmap: a stage reads only the tensors it uses (evaluate: the
        # test split), and pages shared by processes (DataLoader workers, DDP ranks) once.
        ds = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # torch raises many types for a damaged file
        raise DataError(
            f"{path} is unreadable ({reason(exc)}); delete it and run `ampbench download` again"
        ) from exc
    keys = set(ds) if isinstance(ds, dict) else set()
    missing = {"train_images", "train_labels", "test_images", "test_labels", "classes"} - keys
    if missing:
        raise DataError(f"{path} lacks {sorted(missing)}; re-run `ampbench download`")
    if device is not None:
        ds = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in ds.items()}
    return ds


def file_digest(path: Path) -> str:
    """sha256 of a file (the prepared data's identity in MLflow's Dataset column).

    Every train and evaluate stage names its data, and hashing 180 MB costs ~0.4 s each time: the
    download stage records the digest beside the file (``<name>.sha256``, written after it), and
    it is used while the file still has the recorded size and is older than the record (an edit
    makes it newer; a DVC checkout may too: then the file is hashed again).
    """
    path = Path(path)
    record = _digest_file(path)
    try:
        known = json.loads(record.read_text(encoding="utf-8"))
        data, said = path.stat(), record.stat()
        if known.get("size") == data.st_size and data.st_mtime_ns < said.st_mtime_ns:
            return known["sha256"]
    except (OSError, ValueError, KeyError, AttributeError):
        pass  # no record (older download, hand-made file) or a damaged one: hash the file
    return _sha256(path)


def _digest_file(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()
