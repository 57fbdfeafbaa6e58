"""Unpack a tar archive without trusting it: member paths, completeness, and how much it unpacks to.

``safe_extract`` extracts into a temporary folder beside the destination and renames it into place
only once everything is out, so nothing partial is ever left. Before a byte is written it refuses
unsafe members (absolute paths, ``..``, links, devices), damaged archives (bad CRC, cut short) and
archives that would unpack to more than the target filesystem holds or than any data set here
needs (``Room``): a tar bomb, a few MB of gzip that inflate to terabytes of zeros or millions of
files, is refused from its headers, before it fills the disk for everyone on the machine.
"""

from __future__ import annotations

import lzma
import os
import shutil
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import NamedTuple

from tqdm import tqdm

from ampbench import atomic
from ampbench.data import archive_magic, download_lines
from ampbench.data.errors import DataError, no_space, no_space_message, size_text

CHUNK = 1 << 20
# Absolute bounds, whatever the disk holds. CIFAR-10 unpacks to ~186 MB in 8 files (python
# batches) or ~170 MB in 60,000 (ImageFolder JPEGs); ImageNet-1k, the largest set a user might
# fairly bring, is ~147 GB in 1.33 M files, and fits both. A data set is decoded into host memory
# at download, so an archive past them is a bomb or a mistake (and one can still be extracted by
# hand). Members are bounded for memory too: tarfile keeps every header it reads (~460 bytes each
# in Python: ~0.9 GB at the cap).
MAX_BYTES = 256 * 2**30
MAX_MEMBERS = 2_000_000
# Left free on the target filesystem: 1 GiB (the prepared file, checkpoints, logs and whoever else
# writes there) or, on a small filesystem, 5% of it. Inodes likewise keep 5% (at most 100,000).
MARGIN_BYTES = 2**30


class Bound(NamedTuple):
    """One limit on an extraction: how much, said how, and whether freeing disk space lifts it."""

    amount: int
    text: str
    on_disk: bool

    def fix(
        self, folder: Path, yourself: str = "extract it yourself and point data.url at the folder"
    ) -> str:
        if self.on_disk:
            return f"if you trust it: free space there, point {folder} at a larger disk, or {yourself}"
        return f"if you trust it: {yourself}"


@dataclass(frozen=True)
class Room:
    """What an extraction into `folder` may take: bytes on disk and files (members)."""

    folder: Path
    bytes: Bound
    files: Bound
    block: int  # the filesystem's block: a file of 1 byte takes one

    @classmethod
    def of(cls, folder: Path) -> Room:
        fs = os.statvfs(folder)
        free = fs.f_bavail * fs.f_frsize
        margin = min(MARGIN_BYTES, fs.f_blocks * fs.f_frsize // 20)
        spare = f"less {size_text(margin)} kept spare"
        bytes_ = Bound(max(free - margin, 0), f"the {size_text(free)} free on {folder} ({spare})", True)
        if bytes_.amount >= MAX_BYTES:
            bytes_ = Bound(MAX_BYTES, f"the {size_text(MAX_BYTES)} any data set archive may expand to", False)
        spare_inodes = min(fs.f_files // 20, 100_000)
        text = f"the {fs.f_favail:,} free inodes (files) on {folder} (less {spare_inodes:,} kept spare)"
        files = Bound(max(fs.f_favail - spare_inodes, 0), text, True)
        if not fs.f_files or files.amount >= MAX_MEMBERS:  # f_files 0: no inode limit (btrfs)
            files = Bound(MAX_MEMBERS, f"the {MAX_MEMBERS:,} files any data set archive may hold", False)
        return cls(Path(folder), bytes_, files, max(fs.f_frsize, 1))

    def taken(self, member: tarfile.TarInfo) -> int:
        """Bytes `member` takes on disk once extracted: whole blocks (a folder: one)."""
        size = member.size if member.isreg() else self.block if member.isdir() else 0
        return -(-size // self.block) * self.block


def _bounded_members(tar: tarfile.TarFile, archive: Path, room: Room) -> list[tarfile.TarInfo]:
    """Every member, counted and summed as its header is read: a bound is crossed before tarfile
    reads (for a .gz: decompresses) the data of the member that crosses it. A tar's header says
    exactly what its member writes (sparse members included), so the sum is what extraction takes."""
    members, taken = [], 0
    for member in tar:
        members.append(member)
        taken += room.taken(member)
        if taken > room.bytes.amount or len(members) > room.files.amount:
            bound = room.bytes if taken > room.bytes.amount else room.files
            raise DataError(
                f"refusing archive {archive}: it would expand to at least {size_text(taken)} in "
                f"{len(members):,} member(s) (counted up to {member.name[:80]!r}), more than {bound.text}; "
                + bound.fix(room.folder)
            )
    return members


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


def _check_complete(tar: tarfile.TarFile, archive: Path) -> None:
    """Raise _Corrupt unless the archive ends with tar's end-of-archive zero blocks.

    tarfile stops silently at the first member header it cannot read (a flipped byte, a cut) and
    never reads a .gz to its end, where the gzip CRC is checked: read on from where it stopped to
    the end of the (decompressed) stream, so the decompressor checks its CRC, and look at the rest.
    """
    stream = tar.fileobj
    stream.seek(tar.offset)
    rest, garbage = 0, False
    while chunk := stream.read(CHUNK):
        rest += len(chunk)
        garbage = garbage or chunk.count(0) != len(chunk)
    if garbage or rest < tarfile.BLOCKSIZE:
        where = f"unreadable data after member {tar.members[-1].name!r}" if tar.members else "no members"
        raise _Corrupt(f"{where}, no end-of-archive marker: truncated or damaged")


def not_a_tar(archive: Path) -> str:
    """What tarfile could not open in `archive` is, in a few words (tarfile says it in five lines,
    one per method it tried): empty, an empty or damaged compressed stream, or no tar inside."""
    with open(archive, "rb") as f:
        head = f.read(64)
    if kind := archive_magic.other_archive(head):
        return f"it is a {kind} archive; ampbench reads {archive_magic.READ}, so unpack it"
    if not head:
        return "the file is empty (0 bytes)"
    if archive_magic.is_web_page(head):
        return "it is a web page (HTML), not the archive: data.url must be the file's own download link"
    kind = archive_magic.compression(head)
    if kind is None:
        return "it is not a tar archive, nor a gzip, bzip2 or xz compressed one"
    name, module = kind
    try:
        with module.open(archive, "rb") as stream:
            inside = len(stream.read(tarfile.BLOCKSIZE))
    except (EOFError, OSError, lzma.LZMAError, zlib.error):
        return f"its {name} stream is damaged or cut short"
    if not inside:
        return f"it is an empty {name} stream (no tar archive inside)"
    if inside < tarfile.BLOCKSIZE:
        return f"its {name} stream holds only {inside} bytes, less than one tar header: cut short or no tar"
    return f"its {name} stream does not start with a tar header: not a tar archive"


def _with_fix(what: str) -> str:
    if what.endswith("so unpack it"):  # another kind of archive: downloading it again cannot help
        return f"{what} and point data.url at the folder it makes"
    return f"{what}; re-download it, or point data.url at the .tar.gz archive or its extracted folder"


class _Corrupt(Exception):
    """The archive's bytes are damaged (checksum, CRC, cut short); the message says where."""


# Raised while reading a damaged compressed stream (zlib and lzma errors are no OSError).
_DAMAGED = (_Corrupt, EOFError, zlib.error, lzma.LZMAError, tarfile.TarError, OSError)


def safe_extract(archive: Path, dest: Path) -> Path:
    """Extract a tar/tar.gz/tgz into `dest`, refusing unsafe members; all or nothing, atomically.

    A damaged archive (bad CRC, truncated) raises DataError saying so and leaves no extraction,
    not even an older one at `dest` (it no longer matches the archive).
    """
    archive, dest = Path(archive), Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    for kind in ("extracting", "old"):
        atomic.remove_stale_temps(dest, kind)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=atomic.temp_name(dest, "extracting") + "-"))
    opened = False
    try:
        with tarfile.open(archive, "r:*") as tar:
            opened = True
            members = _bounded_members(tar, archive, Room.of(dest.parent))
            _check_complete(tar, archive)
            for member in members:  # check everything before writing anything
                _check_member(member, archive)
            # filter="data" is a second line of defence should the checks above miss something.
            lines = download_lines.counted(members, f"extracting {archive.name}", "files")  # no bar: lines
            bar = tqdm(lines, desc=f"extract {archive.name}", total=len(members), unit="file", disable=None)
            tar.extractall(tmp, members=bar, filter="data")
        if dest.exists():  # move the old copy aside atomically so dest is never half-deleted
            old = Path(tempfile.mkdtemp(dir=dest.parent, prefix=atomic.temp_name(dest, "old") + "-"))
            os.replace(dest, old / dest.name)
            shutil.rmtree(old)
        os.replace(tmp, dest)
    except _DAMAGED as exc:
        if no_space(exc):
            raise DataError(no_space_message(tmp, dest)) from exc
        if not opened and isinstance(exc, tarfile.ReadError):
            raise DataError(f"cannot extract {archive}: {_with_fix(not_a_tar(archive))}") from None
        if not opened or (isinstance(exc, OSError) and exc.errno is not None):
            raise DataError(f"cannot extract {archive}: {exc}; is it a complete tar/tar.gz?") from exc
        shutil.rmtree(dest, ignore_errors=True)
        raise DataError(
            f"the archive {archive} is corrupt (CRC/checksum failure: {exc}): it was damaged or cut short "
            "on the way; re-download it (or point data.url at a good copy), then re-run `ampbench download`"
        ) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
