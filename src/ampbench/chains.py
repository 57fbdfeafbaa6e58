"""An exception's whole story: the error itself, what caused it (``raise ... from``) and what it
interrupted (a raise inside an ``except``), and theirs. The one-line fault messages search it: a
full disk or a lost peer is often two or three links below the error that reached the command.

Nothing is imported here, so a command that ran out of memory can still walk the chain."""

from __future__ import annotations

from collections.abc import Iterator


def chain(err: BaseException | None) -> Iterator[BaseException]:
    """err, then its cause and context, breadth first, each exception once (chains can loop)."""
    seen: set[int] = set()
    todo = [err]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__]


def kinds(err: BaseException) -> set[tuple[str, str]]:
    """(package, class name) of err's class and its bases: the project's errors told apart
    without importing the modules (torch) that define them."""
    return {(c.__module__.partition(".")[0], c.__name__) for c in type(err).__mro__}


def reason(err: BaseException, limit: int = 200) -> str:
    """err's message as a reason inside a line of ours: its first sentence of its first line, at
    most ``limit`` characters (hostile pass WARN: torch's "... internal miniz error. If you are
    seeing this, it means ... please file an issue" in a checkpoint's one line)."""
    text = str(err).strip().split("\n", 1)[0]
    first, dot, _ = text.partition(". ")
    text = first + ("." if dot and not first.endswith(".") else "") if len(first) >= 20 else text
    return text if len(text) <= limit else text[: limit - 3] + "..."


def warning_as_error(err: BaseException) -> str | None:
    """One line where a Python warning, turned into an error (PYTHONWARNINGS=error, -W error), is in
    err's chain (hostile pass F: a library's SADeprecationWarning was reported as a broken MLflow
    store, "check the store")."""
    found = next((e for e in chain(err) if isinstance(e, Warning)), None)
    if found is None:
        return None
    return (
        f"a Python warning was raised as an error ({type(found).__name__}: {reason(found)}), as "
        "PYTHONWARNINGS=error or -W error asks: a library's warning, not a fault of this run; unset "
        "PYTHONWARNINGS (or -W error), then re-run"
    )
