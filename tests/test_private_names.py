"""A name that starts with `_` is its module's own: no other module of src/ampbench imports it or
reaches it through the module (`kit._seconds`). What another module needs is public, and so part of
the module's interface, named and documented as such (issue 37: explain borrowed bench's private
`_trainer`, `_seconds` and `_warm_steps`)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"

# Private names borrowed across modules that are still to be made public (none: the statistics
# report/compare.py lent are report/stats.py's public ones). Each entry must still be borrowed (a
# stale one fails below), so the list only shrinks.
PENDING: set[tuple[str, str]] = set()


def _is_module(name: str) -> bool:
    base = SRC / Path(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def borrowed(source: str) -> set[str]:
    """`module.name` of every private name of another ampbench module this source uses: imported
    (`from ampbench.x import _y`) or reached through an imported module (`x._y`, `ampbench.x._y`)."""
    tree = ast.parse(source)
    modules: dict[str, str] = {}  # local name -> the ampbench module it is bound to
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ampbench":
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if _is_module(full):
                    modules[a.asname or a.name] = full
                elif _private(a.name):
                    found.add(full)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "ampbench":
                    modules[a.asname or a.name] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = ast.unparse(node.value)
            if owner in modules or (owner.startswith("ampbench.") and _is_module(owner)):
                found.add(f"{modules.get(owner, owner)}.{node.attr}")
    return found


def test_no_private_name_is_imported_across_modules():
    uses = set()
    for f in sorted((SRC / "ampbench").rglob("*.py")):
        module = ".".join(f.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        uses |= {(module, name) for name in borrowed(f.read_text())}
    assert not uses - PENDING, f"private names used outside their module (make them public): {uses - PENDING}"
    assert not PENDING - uses, f"no longer borrowed, drop from PENDING: {PENDING - uses}"


def test_each_way_of_borrowing_is_caught():
    """The check itself: an import, a module's attribute (however imported), and what passes."""
    source = (
        "import ampbench.measuring.kit\n"
        "import ampbench.measuring.kit as k\n"
        "from ampbench.measuring import kit\n"
        "from ampbench.report.compare import _ms, ALPHA\n"
        "from ampbench.config.settings import __all__\n"
        "kit._a(); k._b(); ampbench.measuring.kit._c(); kit.seconds(); self._d(); x._e\n"
    )
    assert borrowed(source) == {
        "ampbench.report.compare._ms",
        "ampbench.measuring.kit._a",
        "ampbench.measuring.kit._b",
        "ampbench.measuring.kit._c",
    }
