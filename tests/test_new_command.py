"""A new command is one module plus one line in cli.COMMANDS: docs/INTERNALS.md's worked example
("Adding a command"), taken from that page and run as the page says."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

from ampbench import cli

REPO = Path(__file__).resolve().parents[1]


def _example() -> tuple[str, str, tuple[str, str]]:
    """(the command's name, its module's source, its table line's value) from INTERNALS.md."""
    text = (REPO / "docs" / "INTERNALS.md").read_text()
    section = text.split("## Adding a command\n", 1)[1].split("\n## ", 1)[0]
    source, line = re.findall(r"```python\n(.*?)```", section, re.S)
    name, module, summary = re.fullmatch(r'\s*"(\w+)": \("([\w.]+)", "([^"]+)"\),\s*', line).groups()
    return name, source, (module, summary)


def test_the_documented_command_runs_from_its_file_and_its_line(monkeypatch, capsys):
    name, source, entry = _example()
    assert name not in cli.COMMANDS  # an example, not a command of the project
    module = types.ModuleType(f"ampbench.{entry[0]}")
    exec(compile(source, f"<INTERNALS.md: {entry[0]}>", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)  # the file, as if it were there
    monkeypatch.setitem(cli.COMMANDS, name, entry)  # the line
    params = str(REPO / "params.yaml")
    assert cli.main([name, "--params", params, "--section", "train", "--set", "train.epochs=1"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert "train.epochs = 1" in printed and all(line.startswith("train.") for line in printed)
    help_text = cli._parser([]).format_help()
    assert f"{name}" in help_text and entry[1] in help_text  # listed by `ampbench --help`
