"""The package's architecture, kept by tests: the import graph has no cycle and no upward import
(only stages/ imports stages/), no module over 300 lines nor function over 60, and every DVC
stage depends on exactly the code its command runs (its import closure), bytecode caches aside.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, VENV_BIN, venv_env


def _module_file(module: str) -> Path | None:
    """The file Python runs for an ampbench module (`x.py` or `x/__init__.py`); None for others."""
    base = REPO / "src" / Path(*module.split("."))
    return next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.exists()), None)


def _ampbench_imports(module: str) -> set[str]:
    """ampbench modules that `module` imports anywhere in its file (lazy imports in functions too)."""
    import ast

    tree = ast.parse(_module_file(module).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}  # `from ampbench import data`
    return {m for m in found if m.split(".")[0] == "ampbench" and _module_file(m)}


def _import_closure(module: str) -> set[str]:
    """`module` and every ampbench module it imports, transitively; each package's __init__ too."""
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            parts = m.split(".")
            todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # packages run their __init__
            todo += _ampbench_imports(m)
    return seen


def _command_code(command: str) -> set[Path]:
    """The files `ampbench <command>` runs: the script's entry and CLI, the command's module
    (cli.command_module) and their imports, and the processes they start as `python -m ampbench
    [helper]` (torchrun's workers, the system-metrics sampler of cli.HELPERS), found by those names
    in the code."""
    from ampbench import cli

    # the `ampbench` script's module (pyproject.toml), which loads the CLI
    modules = _import_closure("ampbench.entry") | _import_closure(cli.command_module(command).__name__)
    while True:
        text = "".join(_module_file(m).read_text() for m in modules - {"ampbench.cli"})
        started = {"ampbench.__main__"} if '"-m", "ampbench"' in text else set()
        started |= {target.split(":")[0] for name, target in cli.HELPERS.items() if f'"{name}"' in text}
        more = set().union(*map(_import_closure, started)) - modules
        if not more:
            return {_module_file(m) for m in modules}
        modules |= more


def test_every_stage_depends_on_all_the_code_it_runs():
    """A stage whose deps miss a module it imports keeps stale results after that module changes; one
    whose deps cover code it never runs re-runs for nothing (a report wording fix retraining)."""
    import tomllib

    import yaml

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    stages.update(yaml.safe_load((REPO / "explain" / "dvc.yaml").read_text())["stages"])  # outside the study
    missing, extra, code = {}, {}, {}
    for name, stage in stages.items():
        program, command = stage["cmd"].split()[:2]
        assert scripts[program] == "ampbench.entry:run", stage["cmd"]
        code[name] = _command_code(command)
        deps = [REPO / d for d in stage["deps"]]
        uncovered = [f for f in code[name] if not any(f.is_relative_to(d) for d in deps)]
        covered = {f for d in deps if d.is_relative_to(REPO / "src") for f in [d, *d.rglob("*.py")]}
        unused = [f for f in covered if f.suffix == ".py" and f not in code[name]]
        missing.update({name: sorted(str(f.relative_to(REPO)) for f in uncovered)} if uncovered else {})
        extra.update({name: sorted(str(f.relative_to(REPO)) for f in unused)} if unused else {})
    assert code["explain"] and stages["explain"]["wdir"] == ".."  # its paths are the root's
    assert not missing, f"dvc.yaml stages lack deps on code they import: {missing}"
    assert not extra, f"dvc.yaml stages depend on code they never run (list files instead): {extra}"
    # The walk itself: lazy imports inside functions are followed, started processes too, and the
    # stages stay apart (comparing trains nothing, the report's prose re-runs nothing).
    src = REPO / "src" / "ampbench"
    assert {src / "stages" / "train.py", src / "training" / "loop.py", src / "__main__.py"} <= code["train"]
    assert not any(f.is_relative_to(src / "training") for f in code["compare"] | code["download"])
    assert all(src / "report" / "findings.py" not in files for files in code.values())


@pytest.mark.slow
def test_bytecode_caches_are_not_part_of_the_code_dependency(tmp_path):
    """Importing src/ampbench writes __pycache__ there; as part of the dep, every run would change it."""
    shutil.copy(REPO / ".dvcignore", tmp_path / ".dvcignore")
    dvc = str(VENV_BIN / "dvc")
    subprocess.run([dvc, "init", "--no-scm", "-q"], cwd=tmp_path, env=venv_env(), check=True, timeout=120)
    check = [
        str(VENV_BIN / "dvc"),
        "check-ignore",
        "src/ampbench/__pycache__/cli.cpython-311.pyc",
        "src/ampbench/cli.py",
    ]
    out = subprocess.run(check, cwd=tmp_path, env=venv_env(), capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["src/ampbench/__pycache__/cli.cpython-311.pyc"], out.stdout + out.stderr


def test_the_import_graph_has_no_cycle_and_no_stage_is_imported_from_below():
    """Every module's imports (lazy ones too) form no cycle; only stages/ and commands/ import them
    (the CLI names each command's module as a string), so a capability folder never reaches up into
    a command."""
    src = REPO / "src"
    modules = {
        ".".join(f.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
        for f in src.rglob("*.py")
    }
    graph = {m: set(_ampbench_imports(m)) - {m} for m in modules}
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for other in sorted(graph.get(module, ())):
            assert state.get(other) != 1, f"import cycle: {' -> '.join([*path, module, other])}"
            if other not in state:
                visit(other, [*path, module])
        state[module] = 2

    for module in sorted(modules):
        if module not in state:
            visit(module, [])
    entries = ("ampbench.stages.", "ampbench.commands.")  # what cli.COMMANDS names
    upward = {m: sorted(i for i in graph[m] if i.startswith(entries)) for m in modules}
    assert not {m: i for m, i in upward.items() if i and not m.startswith(entries)}


def test_no_module_over_300_lines_and_no_function_over_60():
    """Modules with one job and functions that fit a screen (the package's layout rule)."""
    import ast

    big = []
    for f in sorted((REPO / "src" / "ampbench").rglob("*.py")):
        text = f.read_text()
        if text.count("\n") > 300:
            big.append(f"{f.relative_to(REPO)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and node.end_lineno - node.lineno >= 60
            ):
                big.append(
                    f"{f.relative_to(REPO)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1}"
                )
    assert not big, big
