"""`ampbench findings` (docs/FINDINGS.md): each claim's section and verdict line, from hand-made
metrics (fast), and end to end from tiny train + evaluate runs in both conditions (slow), whose
cited run ids must exist in the MLflow store.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from ampbench.report import claims
from ampbench.report import findings_report as findings
from conftest import mlflow_client, run_cli, write_params

PRECISIONS = ("fp32", "autocast", "autocast_gradscaler")
RUN_ID = re.compile(r"`([0-9a-f]{32})`")


def _id(name: str) -> str:
    """A made-up MLflow run id (32 hex digits), unique per name."""
    return hashlib.md5(name.encode()).hexdigest()


def _record(variant: str, accs, ips, batch=128, loader="dataloader", **extra) -> dict:
    seeds = [
        {
            "seed": i,
            "run_id": _id(f"{variant}-seed{i}"),
            "variant_run_id": _id(variant),
            "test_accuracy": a,
            "images_per_second": s,
            "train_seconds": 50000 * 20 / s,
            "device_name": "NVIDIA H200",
            "amp_dtype": "float32" if variant.endswith("fp32") else "float16",
            "cuda_graph_used": False,
            "epochs_completed": 20,
            "devices_used": 1,
            "train.batch_size": batch,
            "train.loader": loader,
            "train.workers": 8,
            **extra,
        }
        for i, (a, s) in enumerate(zip(accs, ips))
    ]
    return {"variant": variant, "seeds": seeds}


def _study(ips: dict, accs: dict, **extra) -> dict:
    return {f"single-{p}": _record(f"single-{p}", accs[p], ips[p], **extra) for p in PRECISIONS}


def _write(folder: Path, study: dict) -> Path:
    (folder / "metrics").mkdir(parents=True)
    for variant, rec in study.items():
        (folder / "metrics" / f"{variant}.json").write_text(json.dumps(rec))
    return folder


SAME_ACC = {p: [0.85, 0.86, 0.855] for p in PRECISIONS}
TUTORIAL = _study(
    {
        "fp32": [22e3, 22.1e3, 21.9e3],
        "autocast": [23e3, 23.2e3, 22.9e3],
        "autocast_gradscaler": [20e3, 20.1e3, 19.9e3],
    },
    SAME_ACC,
)
PROJECT_IPS = {
    "fp32": [52e3, 52.5e3, 51.8e3],
    "autocast": [137e3, 136e3, 138e3],
    "autocast_gradscaler": [121e3, 122e3, 120e3],
}
PROJECT = _study(
    PROJECT_IPS,
    SAME_ACC,
    batch=512,
    loader="device",
)
BENCH = {
    "hardware": "NVIDIA H200",
    "batch": 128,
    "rows": [
        {
            "measure": "ceiling",
            "variant": "single-fp32",
            "images_per_second": 52e3,
            "ms_per_step": 2.46,
            "x": 1,
        },
        {"measure": "ceiling", "variant": "single-autocast", "images_per_second": 137e3, "ms_per_step": 0.93},
        {
            "measure": "ceiling",
            "variant": "single-autocast_gradscaler",
            "images_per_second": 121e3,
            "ms_per_step": 1.06,
            "median_of_windows": True,
        },
        {
            "measure": "dataloader (8 workers)",
            "variant": "single-autocast_gradscaler",
            "images_per_second": 22e3,
            "ms_per_step": 5.8,
        },
    ],
    "profiles": {
        "single-autocast_gradscaler": {
            "ms_per_step": 1.06,
            "kernels": [
                {
                    "kernel": "void at::native::_amp_foreach_non_finite_check_and_unscale_cuda_kernel",
                    "us_per_step": 42.0,
                }
            ],
        }
    },
}


def test_report_has_each_claim_and_a_verdict_of_the_fixed_form():
    text = findings.build(PROJECT, TUTORIAL, BENCH, {"project's study": "reports"})
    found = findings.verdicts(text)
    assert sorted(found) == [1, 2, 3, 4] and all(v in claims.VERDICTS for v, _ in found.values())
    for n in range(1, 5):
        assert f"## Claim {n}: " in text
    assert found[1][0] == "holds only under the tutorial's conditions"  # 1.05x vs 2.6x
    assert found[2][0] == "holds only under the tutorial's conditions"  # 0.91x fp32 there, 2.3x here
    # the same accuracies, but 3 seeds 0.5 points apart cannot show equivalence within 0.5 points
    assert found[3][0] == "not shown either way" and "more seeds would decide" in found[3][1]
    assert found[4][0] == "not tested here"  # no dp run with autocast outside forward on 2+ GPUs
    assert "22,000 images/s" in text and "42.0 µs per step" in text  # bench: DataLoader, non_finite
    cited = set(RUN_ID.findall(text))
    expected = {s["run_id"] for st in (PROJECT, TUTORIAL) for r in st.values() for s in r["seeds"]}
    assert expected <= cited
    assert "NVIDIA H200, batch 128, dataloader (8 workers), eager, float16" in text
    assert "## Summary" in text and "1. autocast barely speeds training up — **holds only" in text


def test_bench_figures_cite_the_bench_run_or_say_they_are_untracked():
    untracked = findings.build(PROJECT, TUTORIAL, BENCH, {})
    assert "bench file, untracked: no MLflow run" in untracked and "bench run `" not in untracked
    run_id = "b" * 32
    tracked = findings.build(PROJECT, TUTORIAL, {**BENCH, "run_id": run_id}, {})
    assert tracked.count(f"bench run `{run_id}`") == 3  # claim 1's DataLoader, claim 2's ceiling and profile
    assert "untracked" not in tracked


def test_a_real_accuracy_difference_and_the_claim4_run():
    accs = dict(SAME_ACC, autocast=[0.80, 0.801, 0.799])
    facts = {
        "devices_used": 2,
        "autocast_placement": "outside_forward",
        "replica_dtypes": "cuda:0=float16,cuda:1=float16",
    }
    dp = _record("dp-autocast", [0.85, 0.86], [1e4, 1e4], **facts)
    project = {**_study({p: [5e4, 5.1e4, 4.9e4] for p in PRECISIONS}, accs), "dp-autocast": dp}
    text = findings.build(project, TUTORIAL, None, {})
    found = findings.verdicts(text)
    assert found[1][0] == "holds" and found[2][0] == "holds only under the tutorial's conditions"
    assert found[3][0] == "holds" and "single-autocast (project's defaults" in found[3][1]
    assert found[4][0] == "does not hold" and "cuda:1=float16" in found[4][1]
    assert "no bench JSON given" in text


def test_missing_inputs_say_how_to_make_them(tmp_path: Path):
    _write(tmp_path / "reports", PROJECT)
    with pytest.raises(findings.FindingsError, match=r"single-fp32\.json.*make tutorial DATA=") as err:
        findings.main(tmp_path / "reports", tmp_path / "tutorial/reports", None, tmp_path / "F.md", None)
    # hostile pass K: a study whose params.yaml leaves variants out, where `dvc repro` makes none
    named = "with params.yaml's `variants` naming them (`parallel` with single, `precision` with all three)"
    assert named in str(err.value)
    # hostile pass L: `cd tutorial && dvc repro` kept its runs in tutorial/mlflow.db, not the study's
    assert "make tutorial DATA=" in str(err.value) and "cd tutorial && dvc repro" not in str(err.value)
    _write(tmp_path / "tutorial/reports", TUTORIAL)
    with pytest.raises(findings.FindingsError, match="ampbench bench"):
        findings.main(
            tmp_path / "reports", tmp_path / "tutorial/reports", tmp_path / "b.json", tmp_path / "F.md", None
        )


def test_readme_block_is_filled_from_the_verdicts(tmp_path: Path):
    _write(tmp_path / "reports", PROJECT)
    _write(tmp_path / "tutorial/reports", TUTORIAL)
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{findings.README_START}\nOUTDATED\n{findings.README_END}\nrest\n")
    findings.main(tmp_path / "reports", tmp_path / "tutorial/reports", None, tmp_path / "docs/F.md", readme)
    text = readme.read_text()
    assert "OUTDATED" not in text and text.endswith("rest\n") and "4. DataParallel needs" in text
    assert "**not tested here**" in text


@pytest.mark.slow
def test_findings_from_tiny_runs_in_both_conditions(project: Path):
    """Train + evaluate single-{fp32, autocast, autocast_gradscaler} in both conditions (2 seeds,
    1 epoch), then `ampbench findings`; every cited run id is a run of the store."""
    tiny = {"epochs": 1, "seeds": [0, 1], "batch_size": 10}
    tutorial = project / "tutorial"
    tutorial.mkdir()
    (tutorial / "data").symlink_to(project / "data")
    (tutorial / "dvc.yaml").symlink_to(project / "dvc.yaml")  # the store stays at the project root
    write_params(project, train=tiny)
    write_params(
        tutorial,
        train={**tiny, "loader": "dataloader", "workers": 0, "cuda_graph": False},
        tracking={"experiment": "cifar10-amp-tutorial", "conditions": "tutorial"},
    )
    env_uri = {"MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}"}
    variants = ",".join(f"single-{prec}" for prec in PRECISIONS)
    for folder in (project, tutorial):
        for prec in PRECISIONS:
            run_cli(folder, "train", "--parallel", "single", "--precision", prec, env=_env(env_uri))
        run_cli(folder, "evaluate", "--variants", variants, env=_env(env_uri))  # one process, as DVC's
    proc = run_cli(project, "findings", "--readme", "", env=_env(env_uri))
    assert "wrote docs/FINDINGS.md and docs/FINDINGS.zh.md" in proc.stdout
    text = (project / "docs" / "FINDINGS.md").read_text()
    zh = (project / "docs" / "FINDINGS.zh.md").read_text()  # the Chinese edition, same runs
    assert sorted(RUN_ID.findall(zh)) == sorted(RUN_ID.findall(text)) and "## 论断 4" in zh
    found = findings.verdicts(text)
    assert sorted(found) == [1, 2, 3, 4] and all(v in claims.VERDICTS for v, _ in found.values())
    cited = set(RUN_ID.findall(text))
    client = mlflow_client(project)
    runs = {}
    for name in ("cifar10-amp", "cifar10-amp-tutorial"):
        exp = client.get_experiment_by_name(name)
        runs.update({r.info.run_id: r for r in client.search_runs([exp.experiment_id])})
    assert cited and cited <= set(runs), cited - set(runs)
    conditions = {runs[r].data.tags.get("ampbench.conditions") for r in cited}
    assert conditions == {"project", "tutorial"}
    assert len(cited) == 2 * 3 * (1 + 2)  # per condition: 3 variants x (variant run + 2 seeds)


def _env(extra: dict) -> dict:
    from conftest import clean_env

    return clean_env(**extra)


def test_claim3_says_equivalent_only_when_every_tost_shows_it():
    tight = {p: [0.8500, 0.8505, 0.8495] for p in PRECISIONS}  # 0.05-point spread
    studies = {
        "project's study": _study(PROJECT_IPS, tight),
        "tutorial's conditions": _study(PROJECT_IPS, tight),
    }
    text = claims.claim3(studies, margin_pts=0.5)
    assert "**Verdict (claim 3): does not hold** — every AMP variant's accuracy is equivalent" in text
    assert "| -0.09 to +0.09 |" in text  # the 90% CI of a zero difference, in points
    wide = claims.claim3(studies, margin_pts=0.05)  # a margin inside the seeds' own spread
    assert "**Verdict (claim 3): not shown either way**" in wide


def test_tost_against_scipys_one_sided_welch_tests():
    from scipy import stats

    from ampbench.report.equivalence import tost

    a, b, m = [0.850, 0.852, 0.848, 0.851], [0.849, 0.851, 0.850], 0.005
    t = tost(a, b, m)
    low = stats.ttest_ind([x + m for x in a], b, equal_var=False, alternative="greater").pvalue
    high = stats.ttest_ind([x - m for x in a], b, equal_var=False, alternative="less").pvalue
    assert t.p == pytest.approx(max(low, high), rel=1e-9) and t.equivalent
    assert t.low < t.delta < t.high and -m < t.low and t.high < m  # equivalent: the CI is inside
    far = tost([x + 0.01 for x in a], b, m)  # a whole point above: outside the margin
    assert not far.equivalent and far.low > m - 0.01
    assert tost([0.85], b, m) is None  # one seed: no test
    assert tost([0.85, 0.85], [0.85, 0.85], m).equivalent  # identical, no spread: exactly 0


def test_claim_1_gives_autocasts_gain_against_tf32_where_measured():
    from ampbench.report import speed_claims

    without = speed_claims.claim1({claims.TUTORIAL: TUTORIAL, claims.PROJECT: PROJECT}, None)
    assert "autocast / tf32" not in without
    tf32 = _record("single-tf32", SAME_ACC["fp32"], [68e3, 68.5e3, 69e3], batch=512, loader="device")
    with_tf32 = {claims.TUTORIAL: TUTORIAL, claims.PROJECT: {**PROJECT, "single-tf32": tf32}}
    text = speed_claims.claim1(with_tf32, None)
    assert "autocast / tf32 = **2.00x** in images/s" in text and "fp32 above is true fp32" in text


@pytest.mark.parametrize(
    ("gradscaler", "said"),
    [
        ([8e3, 30e3, 5e3], "not shown either way** — neither a significant slowdown"),
        ([20e3, 40e3, 30e3], "not shown either way** — neither a significant slowdown"),  # faster: noise
        ([30e3, 30.5e3, 29.5e3], "does not hold** — significantly faster than fp32 under both"),
    ],
)
def test_claim_2_is_not_denied_by_a_slowdown_within_the_noise(gradscaler, said):
    """Hostile pass T: two noisy CPU seeds, GradScaler at 0.40x fp32 (p 0.48) in both studies:
    "Verdict (claim 2): does not hold — never significantly slower than fp32: 0.40x fp32"."""
    from ampbench.report import speed_claims

    fp32, autocast = [22e3, 22.1e3, 21.9e3], [23e3, 23.2e3, 22.9e3]
    noisy = _study({"fp32": fp32, "autocast": autocast, "autocast_gradscaler": gradscaler}, SAME_ACC)
    text = speed_claims.claim2({claims.TUTORIAL: noisy, claims.PROJECT: noisy}, None)
    assert "**Verdict (claim 2): " + said in text, text[-400:]


def test_claim_1_is_not_denied_by_a_speed_up_within_the_noise():
    """Hostile pass V: autocast at 1.43x fp32 with Welch p 0.08 (two noisy CPU seeds): "Verdict
    (claim 1): does not hold"."""
    from ampbench.report import speed_claims

    fp32, gs = [22e3, 22.1e3, 21.9e3], [20e3, 20.1e3, 19.9e3]
    noisy = _study({"fp32": fp32, "autocast": [20e3, 40e3, 35e3], "autocast_gradscaler": gs}, SAME_ACC)
    text = speed_claims.claim1({claims.TUTORIAL: noisy, claims.PROJECT: noisy}, None)
    assert "**Verdict (claim 1): not shown either way** — " in text and "seeds' noise" in text, text[-400:]
    clear = _study({"fp32": fp32, "autocast": [33e3, 33.2e3, 32.9e3], "autocast_gradscaler": gs}, SAME_ACC)
    text = speed_claims.claim1({claims.TUTORIAL: clear, claims.PROJECT: clear}, None)
    assert "**Verdict (claim 1): does not hold** — " in text, text[-400:]


@pytest.mark.parametrize(
    ("autocast", "said"),
    [
        ([15e3, 35e3, 26e3], "not shown either way"),  # 1.15x, but 1.2x is within the noise
        ([25e3, 25.2e3, 24.9e3], "holds"),  # 1.14x, clearly under 1.2x
    ],
)
def test_claim_1_is_not_confirmed_by_a_speed_up_within_the_noise(autocast, said):
    """Hostile pass Z: autocast at 1.15x fp32 with Welch p 0.81 (two noisy CPU seeds): "Verdict
    (claim 1): holds", though 1.2x was as likely."""
    from ampbench.report import speed_claims

    fp32, gs = [22e3, 22.1e3, 21.9e3], [20e3, 20.1e3, 19.9e3]
    study = _study({"fp32": fp32, "autocast": autocast, "autocast_gradscaler": gs}, SAME_ACC)
    text = speed_claims.claim1({claims.TUTORIAL: study, claims.PROJECT: study}, None)
    assert f"**Verdict (claim 1): {said}** — " in text, text[-400:]


def test_a_study_of_variants_trained_with_different_settings_is_refused(tmp_path: Path):
    """Hostile pass Z: single-tf32 retrained with 3 epochs beside 2-epoch variants, compared with
    --allow-mixed; findings weighed them against each other, exit 0, "mixed" nowhere."""
    retrained = {**PROJECT, "single-autocast": _record("single-autocast", SAME_ACC["fp32"], [9e4] * 3)}
    for variant, record in retrained.items():
        for seed in record["seeds"]:
            seed["train.epochs"] = 3 if variant == "single-autocast" else 2
    _write(tmp_path / "reports", retrained)
    _write(tmp_path / "tutorial/reports", TUTORIAL)
    with pytest.raises(findings.FindingsError) as err:
        findings.main(tmp_path / "reports", tmp_path / "tutorial/reports", None, tmp_path / "F.md", None)
    said = str(err.value)
    assert said.startswith(f"the project's study: {tmp_path / 'reports/metrics'}/ holds variants trained")
    assert "train.epochs: 3 (single-autocast) vs 2 (single-autocast_gradscaler, single-fp32)" in said
    assert "run `make run` (or `dvc repro`) again" in said and not (tmp_path / "F.md").exists()
