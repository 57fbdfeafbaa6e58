"""Under a `ulimit -v` too tight to load torch at all, a command says so in one line (hostile
re-run: an ImportError traceback, "libtorch_cpu.so: failed to map segment from shared object")."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import clean_env

LIMIT = 3_200_000 * 1024  # `ulimit -v 3200000`: torch loads or aborts in C++ (std::bad_alloc), by luck


@pytest.mark.slow  # `python -m ampbench` in a subprocess
@pytest.mark.parametrize("command", [["train", "--parallel", "single", "--precision", "fp32"], ["compare"]])
def test_a_limit_too_tight_to_load_the_libraries_is_one_line_before_torch(project: Path, command):
    """Hostile re-runs at 3.0-3.6 GB: a C++ abort, OpenBLAS giving up, or an ImportError traceback
    from the fault line's own import, depending on the run."""

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

    proc = subprocess.run(
        [sys.executable, "-m", "ampbench", *command],
        cwd=project,
        env=clean_env(AMPBENCH_WARM="0"),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limited,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "the address-space limit (ulimit -v 3200000 KiB, 3.1 GiB) is below the 4 GiB" in lines[0], lines[0]
    assert "raise it" in lines[0], lines[0]


# Raises, for the named top-level packages, what a loader out of address space raises: torch loads,
# the command's later libraries do not (hostile re-run: `ulimit -v 3300000` under compare).
BLOCKED_IMPORTS = """
import sys
from ampbench import cli

class OutOfMemory:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("scipy", "sqlalchemy"):  # sqlalchemy: the store's fault check
            raise ImportError("libscipy_openblas.so: failed to map segment from shared object")
        if name.startswith("ampbench.tracking"):  # what the fault line needed to import, too
            raise MemoryError()
        return None

sys.meta_path.insert(0, OutOfMemory())
sys.argv[1:] = ["compare"]
sys.exit(cli.main())
"""


@pytest.mark.slow  # imports torch in a subprocess
def test_a_library_that_does_not_fit_after_torch_is_one_line_at_the_start(project: Path):
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORTS],
        cwd=project,
        env=clean_env(AMPBENCH_WARM="0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "not enough memory to load the libraries this command needs" in lines[0], lines[0]
    assert "failed to map segment" in lines[0] and "compare" not in proc.stdout, lines[0]


def test_memory_the_work_runs_out_of_is_not_blamed_on_the_libraries(tmp_path, monkeypatch):
    """Hostile pass H WARN: decoded images at data.image_size 4096 under `ulimit -v` were said to
    be "not enough memory to load the libraries", with no word of the work's size."""
    from ampbench import address_space

    def decode():
        raise MemoryError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 13 GB")

    try:
        decode()
    except MemoryError as err:
        work = address_space.out_of_memory(err)
    assert work.startswith("not enough memory for this command's work (MemoryError: DefaultCPUAllocator")
    assert "data.image_size, train.batch_size, the model" in work
    (tmp_path / "big_library.py").write_text("raise MemoryError()\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import big_library  # noqa: F401
    except MemoryError as err:
        loading = address_space.out_of_memory(err)
    assert loading.startswith("not enough memory to load the libraries this command needs"), loading
