"""`make run|demo|tutorial|explain DATA=<path>` hands the path on whole, spaces and quotes included
(`make -n`: the recipes as the shell would run them, nothing run)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from conftest import REPO

PATHS = ["/tmp/my data/cifar-10 python.tar.gz", "rel dir/it's.tar.gz", "~/cifar 10.tar.gz"]


def _recipes(target: str, data: str, tmp_path) -> list[list[str]]:
    """The shell lines `make TARGET DATA=data` would run, each as the words the shell reads."""
    proc = subprocess.run(
        ["make", "-n", "-C", str(REPO), target, f"DATA={data}", f"VENV={tmp_path / 'venv'}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = proc.stdout.replace("\\\n", " ").splitlines()  # a recipe line continued with `\`: one line
    return [_words(line) for line in lines if line.strip()]


def _words(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)  # `;` and `||` apart
    lexer.whitespace_split = True
    return list(lexer)


def _absolute(data: str) -> str:
    """A relative path made absolute; a quoted ~/... kept (hostile re-run: it became <repo>/~/...),
    for the download stage to expand."""
    return data if data.startswith(("/", "~")) else f"{REPO}/{data}"


@pytest.mark.parametrize("data", PATHS)
def test_make_run_passes_a_data_path_with_spaces_as_one_word(data, tmp_path):
    words = next(w for w in _recipes("run", data, tmp_path) if "ampbench.dvc_run" in w)
    assert words[words.index("-S") + 1] == f"data.url={_absolute(data)}", words
    resume = next(w for w in words if w.startswith("AMPBENCH_RESUME_COMMAND="))
    assert shlex.split(resume.split("=", 1)[1]) == ["make", "run", f"DATA={data}"]


@pytest.mark.parametrize("target", ["demo", "tutorial"])
def test_make_demo_and_tutorial_write_the_whole_path_into_their_params(target, tmp_path):
    data = PATHS[0]
    words = next(w for w in _recipes(target, data, tmp_path) if "sed" in w)
    sed = words[words.index("sed") :]
    # demo's runs in demo/ (the committed file is put back after the run), tutorial's from the root
    params = "params.yaml" if target == "demo" else f"{target}/params.yaml"
    assert sed[2] == f"s|^  url: .*|  url: {data}|" and sed[3] == params, sed


def test_make_explain_downloads_from_the_whole_path(tmp_path):
    line = next(w for w in _recipes("explain", PATHS[1], tmp_path) if "download" in w)
    assert line[line.index("--set") + 1] == f"data.url={_absolute(PATHS[1])}", line


@pytest.mark.parametrize("data", PATHS)
def test_make_runs_estimate_counts_the_data_it_will_train_on(data, tmp_path):
    """The estimate reads DATA too: data prepared from it is counted, not CIFAR-10's 50,000."""
    words = next(w for w in _recipes("run", data, tmp_path) if "estimate" in w and "ampbench" in w)
    estimate = words[len(words) - words[::-1].index("estimate") - 1 :]  # the command, not its echo
    assert estimate[1:3] == ["--set", f"data.url={_absolute(data)}"], words
