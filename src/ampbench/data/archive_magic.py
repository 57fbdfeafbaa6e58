"""What a file's first bytes say it is, for the two places that look before tarfile does: the
download stage's refusal (``extract.not_a_tar``) and `make run DATA=`'s check before DVC
(``dvc_guard``, which imports no torch). Standard library only."""

from __future__ import annotations

import bz2
import gzip
import lzma

# How each compression tarfile reads starts, and the module that opens it.
COMPRESSIONS = {b"\x1f\x8b": ("gzip", gzip), b"BZh": ("bzip2", bz2), b"\xfd7zXZ\x00": ("xz", lzma)}


def is_web_page(head: bytes) -> bool:
    """A web page where the archive was meant (final pass H: a URL of a page, not of the file)."""
    return head.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html", b"<?xml", b"<head"))


def compression(head: bytes) -> tuple[str, object] | None:
    """(name, module) of the compressed stream ``head`` starts, or None."""
    return next((named for magic, named in COMPRESSIONS.items() if head.startswith(magic)), None)
