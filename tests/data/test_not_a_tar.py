"""An archive tarfile cannot open is one line saying what it is (empty, an empty or damaged
compressed stream, no tar inside) and the fix, not tarfile's five lines, one per method it tried
(issue 36, W6: an empty .tar.gz)."""

from __future__ import annotations

import bz2
import gzip

import pytest

from ampbench.data import extract
from ampbench.data.errors import DataError

FIX = "; re-download it, or point data.url at the .tar.gz archive or its extracted folder"


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"", "the file is empty (0 bytes)"),
        (gzip.compress(b""), "it is an empty gzip stream (no tar archive inside)"),
        (bz2.compress(b""), "it is an empty bzip2 stream (no tar archive inside)"),
        (gzip.compress(b"hello\n"), "its gzip stream holds only 6 bytes, less than one tar header"),
        (gzip.compress(b"<html>" + b"x" * 2000), "its gzip stream does not start with a tar header"),
        # final pass H: a page's URL for the archive's
        (b"<html>an error page</html>" * 40, "it is a web page (HTML), not the archive: data.url must be"),
        (b"\n  <!DOCTYPE html><html>a download page</html>", "it is a web page (HTML)"),
        (b"MZ\x90\x00 a program" * 40, "it is not a tar archive, nor a gzip, bzip2 or xz compressed one"),
        (b"\x1f\x8b" + b"\0" * 100, "its gzip stream is damaged or cut short"),
    ],
    ids=[
        "zero-bytes",
        "empty-gzip",
        "empty-bzip2",
        "tiny-gzip",
        "gzip-of-html",
        "html",
        "doctype",
        "other",
        "damaged",
    ],
)
def test_an_archive_tarfile_cannot_open_is_one_line(tmp_path, content, said):
    archive = tmp_path / "cifar-10-python.tar.gz"
    archive.write_bytes(content)
    dest = tmp_path / "extracted"
    with pytest.raises(DataError) as err:
        extract.safe_extract(archive, dest)
    message = str(err.value)
    assert "\n" not in message, message
    assert message.startswith(f"cannot extract {archive}: {said}") and message.endswith(FIX), message
    assert not dest.exists() and sorted(p.name for p in tmp_path.iterdir()) == [archive.name]


@pytest.mark.parametrize(
    ("head", "kind"), [(b"PK\x03\x04", "zip"), (b"7z\xbc\xaf\x27\x1c", "7z"), (b"Rar!\x1a\x07\x00", "rar")]
)
def test_another_kind_of_archive_is_named_and_told_to_unpack_not_to_download_again(tmp_path, head, kind):
    """Hostile pass P: a .zip was "not a tar archive, nor a gzip, bzip2 or xz compressed one;
    re-download it": it never said zip, and downloading it again cannot help."""
    from ampbench import dvc_guard

    archive = tmp_path / f"cifar.{kind}"
    archive.write_bytes(head + b"x" * 600)
    with pytest.raises(DataError) as err:
        extract.safe_extract(archive, tmp_path / "extracted")
    assert str(err.value) == (
        f"cannot extract {archive}: it is a {kind} archive; ampbench reads tar, tar.gz, tar.bz2, tar.xz or "
        "an image folder, so unpack it and point data.url at the folder it makes"
    )
    said = dvc_guard.data_fault(str(archive))  # make run DATA=...: before the estimate
    assert (
        said.startswith(f"DATA={archive}: is a {kind} archive; ampbench reads tar,") and "unpack it" in said
    )
