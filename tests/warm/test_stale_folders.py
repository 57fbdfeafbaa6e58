"""A pipeline command killed outright (kill -9, a hang-up) leaves its warm server's folder in the
temp folder; the next command removes this user's folders whose command is gone."""

from __future__ import annotations

import os
import subprocess

from ampbench.warm import scope


def _folder(tmp, name: str, owner: int | None):
    folder = tmp / f"{scope.PREFIX}{name}"
    folder.mkdir()
    (folder / "server.log").write_text("log")
    if owner is not None:
        (folder / scope.OWNER).write_text(str(owner))
    return folder


def test_the_folders_of_commands_that_are_gone_are_removed_and_no_other(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid is free now (reaped)
    dead = _folder(tmp_path, "dead", gone.pid)
    live = _folder(tmp_path, "live", os.getpid())
    being_made = _folder(tmp_path, "new", None)
    other = tmp_path / "unrelated-folder"
    other.mkdir()
    assert scope.sweep_stale(tmp_path) == [dead]
    assert not dead.exists() and live.exists() and being_made.exists() and other.exists()


def test_a_folder_never_given_its_owner_is_removed_a_minute_on(tmp_path):
    """Hostile pass G: 29 folders without an owner (their command killed between making the folder
    and writing its pid) that no sweep would ever remove."""
    old = _folder(tmp_path, "old", None)
    os.utime(old, (0, os.path.getmtime(old) - scope.UNOWNED_S - 1))
    new = _folder(tmp_path, "new", None)
    assert scope.sweep_stale(tmp_path) == [old]
    assert not old.exists() and new.exists()


def test_a_command_writes_its_owner_into_its_folder(monkeypatch, tmp_path):
    """What the sweep reads: the folder serving() makes names its command."""
    monkeypatch.setattr(scope, "enabled", lambda: True)
    monkeypatch.setattr(scope.subprocess, "Popen", _NoServer)
    monkeypatch.setattr(scope, "_stop", lambda server, socket: None)
    with scope.serving() as folder:
        assert (folder / scope.OWNER).read_text() == str(os.getpid())
    assert not folder.exists()


class _NoServer:
    def __init__(self, *args, **kwargs) -> None:
        pass
