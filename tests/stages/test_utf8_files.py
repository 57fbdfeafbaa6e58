"""Every text file the project writes (and reads back) is UTF-8, whatever the locale: under
LC_ALL=C with Python's UTF-8 mode off, `open()` and `Path.write_text()` default to ASCII, and a
report holding "±" or "Δ" failed to be written (issue 36, W1)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from test_reports_truth import PAIR, _record, _write_metrics

from conftest import REPO, run_cli, venv_env

# The locale of a bare container or a cron job: ASCII, no coercion to C.UTF-8, no UTF-8 mode.
ASCII_LOCALE = {"LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
TEXT_FILE_CALLS = ("open", "read_text", "write_text")


@pytest.mark.slow  # `python -m ampbench compare`: MLflow's imports, a store
def test_compare_writes_utf8_reports_under_an_ascii_locale(project):
    _write_metrics(project, {v: _record(v) for v in PAIR})
    proc = run_cli(
        project, "compare", "--variants", ",".join(PAIR), env=venv_env(**ASCII_LOCALE), check=False
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    table = (project / "reports" / "comparison.md").read_bytes().decode("utf-8")
    assert "±" in table and "Δ" in table, table


def _text_calls_without_encoding(path: Path) -> list[str]:
    """`open(...)` in a text mode, `.read_text(...)`, `.write_text(...)` without encoding=, but for
    /proc files (ASCII by the kernel's definition)."""
    source = path.read_text(encoding="utf-8")
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or any(k.arg == "encoding" for k in node.keywords):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if name not in TEXT_FILE_CALLS or (name == "open" and not isinstance(func, ast.Name)):
            continue
        mode = node.args[1] if name == "open" and len(node.args) > 1 else None
        if isinstance(mode, ast.Constant) and "b" in str(mode.value):
            continue
        text = ast.get_source_segment(source, node) or ""
        if "/proc" not in text and "MEMINFO" not in text:
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: {text[:80]}")
    return found


def test_every_text_file_the_project_opens_names_its_encoding():
    missing = [
        call for path in sorted((REPO / "src").rglob("*.py")) for call in _text_calls_without_encoding(path)
    ]
    assert not missing, "pass encoding='utf-8':\n" + "\n".join(missing)
