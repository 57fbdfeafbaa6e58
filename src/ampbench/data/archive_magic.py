"""What a file's first bytes say it is, for the two places that look before tarfile does: the
download stage's refusal (``extract.not_a_tar``) and `make run DATA=`'s check before DVC
(``dvc_guard``, which imports no torch). Standard library only."""

from __future__ import annotations

import bz2
import gzip
import lzma

# How each compression tarfile reads starts, and the module that opens it.
COMPRESSIONS = {b"\x1f\x8b": ("gzip", gzip), b"BZh": ("bzip2", bz2), b"\xfd7zXZ\x00": ("xz", lzma)}


# Archives of other kinds, which tarfile does not read (hostile pass P: a .zip was "not a tar
# archive ...; re-download it", which cannot help).
OTHER_ARCHIVES = {
    *((b"PK\x03\x04", "zip"), (b"PK\x05\x06", "zip")),
    *((b"7z\xbc\xaf\x27\x1c", "7z"), (b"Rar!\x1a\x07", "rar")),
}
READ = "tar, tar.gz, tar.bz2, tar.xz or an image folder"


def other_archive(head: bytes) -> str:
    """Which unread kind of archive ``head`` starts ("zip"), or ""."""
    return next((kind for magic, kind in OTHER_ARCHIVES if head.startswith(magic)), "")


def is_web_page(head: bytes) -> bool:
    """A web page where the archive was meant (final pass H: a URL of a page, not of the file)."""
    return head.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html", b"<?xml", b"<head"))


def compression(head: bytes) -> tuple[str, object] | None:
    """(name, module) of the compressed stream ``head`` starts, or None."""
    return next((named for magic, named in COMPRESSIONS.items() if head.startswith(magic)), None)
