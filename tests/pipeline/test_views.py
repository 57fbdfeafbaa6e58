"""The answer where a user looks in DVC: `dvc metrics show`, the README's `dvc exp show` command and
`dvc plots show`, from the repo root and from demo/ (each study's own rows only, lines that fit a
terminal, plots that render with no network); and a quiet `dvc` under `make run` (no hash
warnings; a stop told as a stop).
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import logging
import math
import re
import shutil
import signal
import subprocess
import tarfile
from pathlib import Path

import pytest

from ampbench import dvc_run
from ampbench.report import answer
from conftest import REPO, VENV_BIN, venv_env

VARIANTS = [f"{p}-{q}" for p in ("single", "dp", "ddp") for q in ("fp32", "autocast", "autocast_gradscaler")]
# What the README shows for `dvc exp show`: one row per experiment, single-autocast's
# speed-up. Its headers are `<file>:<key>` (a key in several files), so nine variants x six
# answers cannot fit a terminal there; `dvc metrics show` has them all, a row per variant.
KEEP = "Experiment|reports/answer/single-autocast.json:Speedup"
EXP_SHOW = ["exp", "show", "--no-pager", "--drop", ".*", "--keep", KEEP]
WIDTH = 100  # a terminal: `dvc metrics show` and the README's `dvc exp show` fit it

# scripts/offline_plots.py is a script, not a module of the package
_spec = importlib.util.spec_from_file_location("offline_plots", REPO / "scripts" / "offline_plots.py")
offline_plots = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(offline_plots)


def fake_rows(variants: list[str], seed: int = 0) -> list[dict]:
    """Rows as report/compare.summarize makes them, with plausible numbers."""
    return [
        dict(
            variant=v,
            test_accuracy_mean=0.84 + 0.001 * i + seed * 1e-4,
            test_accuracy_std=0.0012345,
            accuracy_delta=0.001 * i,
            images_per_second_mean=85_000.4 * (1 + i / 3),
            peak_memory_mb_mean=1234.56,
            speedup=1 + i / 3,
        )
        for i, v in enumerate(variants)
    ]


def write_curves(folder: Path, variants: list[str]) -> Path:
    """evaluate's reports/plots/curves/<variant>.csv: two seeds, three epochs."""
    folder.mkdir(parents=True, exist_ok=True)
    for v in variants:
        with open(folder / f"{v}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["seed", "epoch", "train_loss", "test_accuracy"])
            for seed in (0, 1):
                for epoch in (1, 2, 3):
                    w.writerow([seed, epoch, 1.0, 0.5 + 0.1 * epoch + 0.01 * seed])
    return folder


# ------------------------------------------------------------------ the files the views read
def test_answer_files_hold_one_flat_rounded_row_per_variant(tmp_path: Path):
    rows = fake_rows(VARIANTS[:3])
    rows[1]["accuracy_delta"] = math.nan  # no baseline: left out, not null
    answer.write(rows, write_curves(tmp_path / "curves", VARIANTS[:3]), tmp_path)
    files = sorted((tmp_path / "answer").glob("*.json"))
    assert [f.stem for f in files] == sorted(VARIANTS[:3])
    first = json.loads((tmp_path / "answer" / "single-fp32.json").read_text())
    assert first == {
        "Speedup": 1.0,
        "acc%": 84.0,
        "acc_d": 0.0,
        "acc_sd": 0.12,
        "img/s": 85000,
        "mb": 1235,
    }
    assert "acc_d" not in json.loads((tmp_path / "answer" / "single-autocast.json").read_text())
    with open(tmp_path / "views" / "speedup.csv") as f:
        assert [r["variant"] for r in csv.DictReader(f)] == VARIANTS[:3]
    with open(tmp_path / "views" / "test_accuracy.csv") as f:
        curve = [r for r in csv.DictReader(f) if r["variant"] == "single-fp32"]
    assert [(r["epoch"], r["test_accuracy"]) for r in curve] == [
        ("1", "0.605"),
        ("2", "0.705"),
        ("3", "0.805"),
    ]


def test_a_variant_gone_from_the_study_leaves_no_stale_answer(tmp_path: Path):
    curves = write_curves(tmp_path / "curves", VARIANTS)
    answer.write(fake_rows(VARIANTS), curves, tmp_path)
    answer.write(fake_rows(VARIANTS[:3]), curves, tmp_path)
    assert sorted(f.stem for f in (tmp_path / "answer").glob("*.json")) == sorted(VARIANTS[:3])


# ------------------------------------------------------------------ dvc under make: quiet
def _record(level: int, msg: str, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc else None
    return logging.LogRecord("dvc", level, __file__, 1, msg, (), exc_info)


def test_dvc_run_drops_the_hash_warnings_and_turns_a_stop_into_its_status():
    from dvc.exceptions import ReproductionError
    from dvc.stage.exceptions import StageCmdFailedError

    quiet = dvc_run.Quiet()
    hashless = "No file hash info found for '/p/models/x'. It won't be created."
    assert not quiet.filter(_record(logging.WARNING, hashless))
    assert quiet.filter(_record(logging.WARNING, "some other warning"))
    crash = ReproductionError("failed to reproduce 'evaluate'")  # as dvc/repo/reproduce.py words it
    crash.__cause__ = StageCmdFailedError("ampbench evaluate", 1)
    assert not quiet.filter(_record(logging.ERROR, "", crash)) and not quiet.signum  # the stage said it
    other_tool = ReproductionError("failed to reproduce 'fetch'")
    other_tool.__cause__ = StageCmdFailedError("curl -o x http://x", 6)
    assert quiet.filter(_record(logging.ERROR, "", other_tool)) and not quiet.signum  # stays loud
    stop = ReproductionError("failed to reproduce 'train@single-fp32'")
    stop.__cause__ = StageCmdFailedError("ampbench train --parallel single --precision fp32", 130)
    assert not quiet.filter(_record(logging.ERROR, "", stop))
    assert (quiet.stopped_stage, quiet.signum, quiet.stage_said_it) == (
        "train@single-fp32",
        signal.SIGINT,
        True,
    )
    died = ReproductionError("failed to reproduce 'evaluate'")  # Ctrl-C killed it: no line of its own
    died.__cause__ = StageCmdFailedError("ampbench evaluate", -15)
    other = dvc_run.Quiet()
    assert not other.filter(_record(logging.ERROR, "", died))
    assert (other.stopped_stage, other.signum, other.stage_said_it) == ("evaluate", signal.SIGTERM, False)
    line = dvc_run.stop_line(quiet, ["repro"])
    assert line.startswith("Stopped by SIGINT during stage 'train@single-fp32'") and "dvc repro" in line
    # hostile pass J: "To resume: dvc repro -f", which runs the finished stages again
    assert dvc_run.stop_line(quiet, ["repro", "-f", "train@x"]).endswith("To resume: dvc repro train@x")
    # hostile pass U: but for the stages it forces alone, without -f DVC checks their old outputs out
    for single in (["-s"], ["--single-item"], ["-fs"]):
        argv = ["repro", *(["-f"] if single != ["-fs"] else []), *single, "train@x"]
        assert dvc_run.stop_line(quiet, argv).endswith("To resume: " + " ".join(["dvc", *argv]))


# ------------------------------------------------------------------ the offline plots page
def _npm_tarball(folder: Path, name: str, code: str) -> tuple[str, str]:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        body = code.encode()
        info = tarfile.TarInfo(f"package/build/{name}.min.js")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    path = folder / name / "-" / f"{name}-1.0.0.tgz"
    path.parent.mkdir(parents=True)
    path.write_bytes(data.getvalue())
    return "1.0.0", offline_plots.integrity_of(data.getvalue())


def fake_registry(folder: Path) -> tuple[str, dict]:
    """A file:// npm registry whose three packages define the globals DVC's page calls."""
    packages = {
        name: _npm_tarball(folder, name, f"window.{name.replace('-', '_')}_loaded = true;")
        for name in offline_plots.PACKAGES
    }
    return folder.as_uri(), packages


def test_offline_page_inlines_the_scripts_and_checks_them(tmp_path: Path):
    registry, packages = fake_registry(tmp_path / "registry")
    out = offline_plots.build(tmp_path / "page.html", registry, packages)
    text = out.read_text()
    assert "{plot_divs}" in text and "{scripts}" not in text  # DVC adds no CDN tags
    assert "window.vega_embed_loaded = true;" in text
    assert not re.search(r"<script[^>]+src=", text)
    packages["vega"] = (packages["vega"][0], "sha512-" + "A" * 86 + "==")
    with pytest.raises(RuntimeError, match="integrity"):
        offline_plots.build(tmp_path / "other.html", registry, packages)
    with pytest.raises(RuntimeError, match="</script"):
        offline_plots.page({"vega": "x = '</script>';"})


def test_pinned_versions_are_the_majors_dvc_render_writes():
    import dvc_render.vega

    for name, (version, integrity) in offline_plots.PACKAGES.items():
        major = version.split(".")[0]
        assert f"npm/{name}@{major}." in dvc_render.vega.VegaRenderer.SCRIPTS
        assert integrity.startswith("sha512-")


# ------------------------------------------------------------------ the views themselves
def dvc(folder: Path, *args: str) -> str:
    proc = subprocess.run(
        [str(VENV_BIN / "dvc"), *args],
        cwd=folder,
        env=venv_env(COLUMNS=str(WIDTH)),  # a terminal of WIDTH columns
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"dvc {' '.join(args)}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


LOCAL = shutil.ignore_patterns("tmp", "cache", "config.local")  # a clone has none of these


def _study(folder: Path, variants: list[str], seed: int) -> None:
    """A study's outputs as the compare stage leaves them (answer files, views, the chart)."""
    shutil.copy(REPO / "dvc.yaml", folder / "dvc.yaml")
    reports = folder / "reports"
    answer.write(fake_rows(variants, seed), write_curves(reports / "plots" / "curves", variants), reports)
    (reports / "plots" / "confusion").mkdir()
    for v in variants:
        (reports / "plots" / "confusion" / f"{v}.csv").write_text("actual,predicted\ncat,cat\ncat,dog\n")
    from PIL import Image

    Image.new("RGB", (40, 20), "white").save(reports / "comparison.png")


@pytest.fixture(scope="module")
def studies(tmp_path_factory) -> Path:
    """A git repo laid out as this one: the study at the root, demo/ and tutorial/ (DVC subrepos,
    copied from the repo with their .dvc/) each with its own outputs, committed."""
    root = tmp_path_factory.mktemp("views")
    shutil.copytree(
        REPO / ".dvc", root / ".dvc", ignore=shutil.ignore_patterns("tmp", "cache", "config.local")
    )
    shutil.copy(REPO / ".dvcignore", root / ".dvcignore")
    _study(root, VARIANTS, 0)
    for sub, variants, seed in (("demo", VARIANTS, 1), ("tutorial", VARIANTS[:3], 2)):
        (root / sub).mkdir()
        for name in (".dvc", ".dvcignore", "params.yaml"):
            src = REPO / sub / name
            if src.is_dir():
                shutil.copytree(
                    src, root / sub / name, ignore=shutil.ignore_patterns("tmp", "cache", "config.local")
                )
            else:
                shutil.copy(src, root / sub / name)
        _study(root / sub, variants, seed)
    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "study"]):
        subprocess.run(git + cmd, cwd=root, check=True, capture_output=True)
    return root


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["", "demo", "tutorial"])
def test_metrics_show_is_this_studys_answer_in_a_terminal(studies: Path, where: str):
    out = dvc(studies / where, "metrics", "show")
    lines = _rows(out)
    assert all(len(line) <= WIDTH for line in lines), max(map(len, lines))
    assert lines[0].split() == ["Path", "Speedup", "acc%", "acc_d", "acc_sd", "img/s", "mb"]
    paths = [line.split()[0] for line in lines[1:]]
    expected = VARIANTS[:3] if where == "tutorial" else VARIANTS
    assert sorted(paths) == sorted(f"reports/answer/{v}.json" for v in expected)  # nobody else's
    assert "failed" not in out


@pytest.mark.slow
@pytest.mark.parametrize("where", ["", "demo"])
def test_readme_exp_show_fits_a_terminal_with_the_speedups(studies: Path, where: str):
    lines = _rows(dvc(studies / where, *EXP_SHOW))
    assert all(len(line) <= WIDTH for line in lines), "\n".join(lines)
    header = next(line for line in lines if "Experiment" in line)
    assert "reports/answer/single-autocast.json:Speedup" in header, header
    assert "…" not in "\n".join(lines) and "demo" not in header and "tutorial" not in header


@pytest.mark.slow
@pytest.mark.parametrize("where", ["", "demo"])
def test_plots_show_renders_offline_and_compares_the_variants(studies: Path, where: str, tmp_path: Path):
    registry, packages = fake_registry(tmp_path / "registry")
    page = offline_plots.build(tmp_path / "page.html", registry, packages)
    out = tmp_path / "plots"
    text = dvc(studies / where, "plots", "show", "--html-template", str(page), "-o", str(out))
    assert "failed" not in text
    html = (out / "index.html").read_text()
    assert not re.findall(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html)  # nothing to fetch
    assert "cdn.jsdelivr" not in html
    assert 'id = "Speed-up_over_single-fp32' in html and 'id = "Test_accuracy_per_epoch' in html
    assert '<img src="static/' in html  # reports/comparison.png, an image plot
    assert html.count("reports/plots/confusion/") >= 1
    for other in ("demo/", "tutorial/", "../"):
        assert f"{other}reports" not in html  # no other study's plots
