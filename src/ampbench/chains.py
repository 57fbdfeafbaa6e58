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
