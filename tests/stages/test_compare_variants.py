"""compare's --variants: a repeated or empty list is refused before anything is read (hostile
re-run: `--variants single-fp32,single-fp32` answered "no variant trains faster than single-fp32",
and `--variants ''` silently compared the whole study)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli


@pytest.mark.slow  # `python -m ampbench` subprocesses: ~2 s each for the imports
@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("single-fp32,single-fp32", "--variants: single-fp32 named twice; name each variant once"),
        ("", "--variants '' names no variant; leave it out for the study's"),
        (" , ", "--variants ' , ' names no variant"),
    ],
)
def test_a_repeated_or_empty_variant_list_is_refused(project: Path, given, said):
    proc = run_cli(project, "compare", "--variants", given, check=False)
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (project / "reports").exists()
