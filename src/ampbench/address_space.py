"""The address space a command needs just to load its libraries, and the one line when it has not
got it. torch, MLflow, SciPy and scikit-learn take 3.6 GiB of address space before any work
(measured on the 2-core CI machine: VmSize after their imports). Under a tighter `ulimit -v` the
loading fails in ways no Python code can turn into a line: a C++ ``std::bad_alloc`` abort, "OpenBLAS
error: Memory allocation still failed", or an ImportError in the very code that would say so
(hostile re-runs at 3.0-3.6 GB). So a limit below ``FLOOR_GIB`` is refused before torch is imported,
and a loading failure above it is still named in one line (``out_of_memory``).

Nothing is imported here: it runs when memory is short.
"""

from __future__ import annotations

import resource

from ampbench.chains import chain

FLOOR_GIB = 4.0  # the 3.6 GiB measured, with room for the threads a larger machine starts
FIX = (
    "leaves too little for torch and its libraries (a few GB of address space); raise it "
    "(`ulimit -v unlimited`) or free memory, then run it again"
)
OUT_OF_MEMORY = f"out of memory: this machine or its address-space limit {FIX}"


def _limit() -> int | None:
    """The soft `ulimit -v` in bytes, None without one."""
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def below_floor() -> str | None:
    """One line if `ulimit -v` is below what loading the libraries takes, else None."""
    soft = _limit()
    if soft is None or soft >= FLOOR_GIB * 2**30:
        return None
    return (
        f"the address-space limit (ulimit -v {soft // 1024} KiB, {soft / 2**30:.1f} GiB) is below the "
        f"{FLOOR_GIB:.0f} GiB that torch and the libraries ampbench loads take before any work; raise "
        "it (`ulimit -v unlimited`, or at least `ulimit -v 4194304` plus what the model needs), then "
        "run it again"
    )


def _importing(err: BaseException) -> bool:
    """Whether err was raised while a module was being imported: a module's own code (a frame named
    <module>) below the frame that caught it (importlib leaves its own frames out)."""
    tb = err.__traceback__
    tb = tb and tb.tb_next
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "<module>":
            return True
        tb = tb.tb_next
    return False


def out_of_memory(err: BaseException) -> str | None:
    """One line for a library that could not be loaded for want of memory (the loader failed to
    map a shared object, a MemoryError, ENOMEM) anywhere in err's chain, else None."""
    errors = list(chain(err))
    if not any(
        isinstance(e, MemoryError)
        or "failed to map segment" in str(e)
        or "cannot allocate memory" in str(e).lower()
        for e in errors
    ):
        return None
    soft = _limit()
    limit = "this machine" if soft is None else f"the address-space limit (ulimit -v {soft // 1024} KiB)"
    what = f"{type(errors[-1]).__name__}: {' '.join(str(errors[-1]).split())[:120]}"
    if not any(
        isinstance(e, ImportError) or "failed to map segment" in str(e) or _importing(e) for e in errors
    ):
        # the work's own memory, not the libraries' (hostile pass H: decoded images at
        # data.image_size 4096, said to be "the libraries this command needs")
        return (
            f"not enough memory for this command's work ({what}): {limit} cannot hold it; make the "
            "work smaller (data.image_size, train.batch_size, the model) or give it more memory "
            "(`ulimit -v unlimited`, another machine), then run it again"
        )
    return f"not enough memory to load the libraries this command needs ({what}): {limit} {FIX}"
