"""Time estimates (training/progress.py, training/study_cost.py): the stage estimate from
timed steps and against a real stage's time, the study's remaining work from what is on disk, and
the `ampbench estimate` preflight."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch

from ampbench.config import PARALLELS, PRECISIONS, Config, replace
from ampbench.training import progress, study_cost
from conftest import clean_env, make_dataset, run_cli, write_params

ESTIMATE = re.compile(r"Expected time of this stage \(.*?\): (.+?) in all, (.+?) left")


def seconds(text: str) -> float:
    """Inverse of estimate.fmt_duration for what a short stage prints (`27 s`, `1 min 05 s`)."""
    m = re.fullmatch(r"(?:(\d+) min )?(\d+) s", text)
    assert m, text
    return int(m.group(1) or 0) * 60 + int(m.group(2))


def test_fmt_duration():
    assert study_cost.fmt_duration(4.4) == "4 s"
    assert study_cost.fmt_duration(65) == "1 min 05 s"
    assert study_cost.fmt_duration(2 * 3600 + 5 * 60) == "2 h 05 min"
    assert study_cost.fmt_duration(18 * 86400 + 3 * 3600) == "18 d 3 h"
    assert seconds(study_cost.fmt_duration(65)) == 65


@pytest.mark.slow
@pytest.mark.serial  # times a real stage against its estimate: alone on the machine
def test_stage_estimate_within_25_percent_of_the_real_stage_time(tmp_path: Path):
    """A short CPU schedule: the estimate logged after the first timed steps vs the stage's wall time."""
    from ampbench.data import prepared

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "dvc.yaml").write_text("stages: {}\n")
    write_params(proj, model={"fc_dim": 256}, train={"epochs": 2, "batch_size": 20, "seeds": [0, 1]})
    # 40 steps per epoch: the timing window (2 warm-up steps, >= 1 s) ends inside the first epoch.
    dataset = make_dataset(n_train_per_class=80, n_test_per_class=20)
    prepared.save_dataset(dataset, proj / "data" / "prepared" / "cifar10.pt")
    start = time.perf_counter()
    proc = run_cli(proj, "train", "--parallel", "single", "--precision", "fp32", env=clean_env())
    real = time.perf_counter() - start
    found = ESTIMATE.findall(proc.stderr)
    assert len(found) == 1, proc.stderr[-3000:]  # once per stage, after the first timed steps
    estimate = seconds(found[0][0])
    assert abs(estimate - real) <= 0.25 * real, f"estimated {estimate} s, took {real:.1f} s\n{proc.stderr}"
    assert "whole study still needs about" in proc.stderr


def test_stage_estimate_from_the_timed_steps(tmp_path: Path):
    """The step time is measured after the warm-up; what is left is the remaining steps at that time."""
    cfg = _cfg(seeds=(0, 1), eval_each_epoch=False)
    spe, n_test, pause = 10, 20, 0.02
    stage = progress.StageProgress(
        cfg,
        "single-fp32",
        spe,
        n_test,
        "cpu",
        enabled=False,
        warmup_steps=2,
        min_timed_s=0.0,
        min_timed_steps=3,
        models_dir=tmp_path / "models",
        work_dir=tmp_path / "work",
        params_file=tmp_path / "params.yaml",
    )
    stage.start_seed(0)
    for _ in range(5):
        assert stage.estimate is None  # 2 warm-up steps, then 3 timed ones
        time.sleep(pause)
        if stage.step():  # the loop reports outside its clock
            stage.report()
    assert stage.estimate is not None and stage.step_s >= pause * 0.9
    # seed 0 from step 5 on, then all of seed 1 (its setup time included)
    steps = study_cost.seed_steps(cfg, spe, n_test, 0, 5) + study_cost.seed_steps(cfg, spe, n_test)
    left = stage.estimate["stage_left_seconds"]
    assert left == pytest.approx(steps * stage.step_s + stage.seed_setup_s)
    assert stage.estimate["study_left_seconds"] > left  # eight more variants, evaluations, comparison
    stage.epoch_done()
    assert (stage.epoch, stage.step_in_epoch) == (1, 0)
    stage.close()


def _cfg(**train) -> Config:
    return replace(
        Config(),
        model={"fc_dim": 32},
        train={"epochs": 4, "batch_size": 10, **train},
        data={"train_per_class": 10, "test_per_class": 2},
    )


def test_remaining_work_counts_finished_models_and_checkpoints(tmp_path: Path):
    cfg = _cfg(seeds=(0, 1), eval_each_epoch=False)
    models, work = tmp_path / "models", tmp_path / "checkpoints"
    spe, n_test = 10, 20
    full = study_cost.seed_steps(cfg, spe, n_test)
    assert full == 4 * 10 + 20 * 2 / 3 / 10  # 40 steps + one flipped test pass (a third of a step each)
    digest = cfg.digest()
    done = models / "single-fp32" / "seed-0" / "model.pt"
    done.parent.mkdir(parents=True)
    torch.save({"state_dict": {}, "config_digest": digest}, done)
    half = work / "single-fp32" / "seed-1" / "checkpoint.pt"
    half.parent.mkdir(parents=True)
    torch.save({"epoch": 2, "step": 0, "config_digest": digest}, half)
    stale = models / "dp-fp32" / "seed-0" / "model.pt"
    stale.parent.mkdir(parents=True)
    torch.save({"state_dict": {}, "config_digest": "another"}, stale)

    def left(variant: str, seed: int) -> float:
        return study_cost.remaining_seed_steps(cfg, variant, seed, spe, n_test, models, work)

    assert left("single-fp32", 0) == 0
    assert left("single-fp32", 1) == study_cost.seed_steps(cfg, spe, n_test, 2, 0) == 20 + 20 * 2 / 3 / 10
    assert left("dp-fp32", 0) == full  # another configuration's model is no finished work


def test_study_variants_follow_params(tmp_path: Path):
    params = tmp_path / "params.yaml"
    params.write_text("variants:\n  parallel: [single]\n  precision: [fp32, autocast]\n")
    assert study_cost.study_variants(params) == ["single-fp32", "single-autocast"]
    every = [f"{p}-{q}" for p in PARALLELS for q in PRECISIONS]  # the registries' (12 with bf16)
    assert study_cost.study_variants(tmp_path / "missing.yaml") == every


def test_preflight_estimates_the_study_and_points_at_the_demo(tmp_path: Path, capsys):
    params = tmp_path / "params.yaml"
    params.write_text("variants:\n  parallel: [single, ddp]\n  precision: [fp32, autocast]\n")
    cfg = replace(Config(), model={"fc_dim": 32}, train={"batch_size": 16})
    assert progress.preflight is study_cost.preflight  # what `ampbench estimate` calls
    out = study_cost.preflight(cfg, params, probe_batch=4, force=True)
    text = capsys.readouterr().out
    assert "full study on a CPU" in text and "4 variants x 3 seeds x 20 epochs x 3125 steps" in text
    assert out["study_seconds"] > 0 and set(out["step_seconds"]) == {"fp32", "autocast"}
    assert ("make demo" in text) == (out["study_seconds"] > study_cost.LONG_ON_CPU_S)


def test_the_estimate_counts_the_variants_a_commands_set_narrows_to(tmp_path: Path, capsys):
    """Hostile pass J: `ampbench estimate --set variants.parallel=[single] --set
    variants.precision=[fp32]` estimated all 9 variants (exit 0); the same in params.yaml: 1."""
    params = tmp_path / "params.yaml"
    params.write_text("variants:\n  parallel: [single, dp, ddp]\n  precision: [fp32, autocast]\n")
    cfg = replace(Config(), model={"fc_dim": 32}, train={"batch_size": 16})
    narrowed = ["variants.parallel=[single]", "variants.precision=[fp32]"]
    out = study_cost.preflight(cfg, params, probe_batch=4, force=True, overrides=narrowed)
    assert "1 variants x 3 seeds" in capsys.readouterr().out and set(out["step_seconds"]) == {"fp32"}


@pytest.mark.parametrize("scope", ["", "variant"])
def test_a_single_variant_run_estimates_no_study(tmp_path: Path, monkeypatch, caplog, scope: str):
    """`ampbench variant` (`mlflow run`) trains one variant: its estimate names no "whole study"."""
    monkeypatch.setenv("AMPBENCH_SCOPE", scope)
    # the whole data set: a subset is a demo, whose stage estimate goes to DEBUG with no study
    cfg = replace(_cfg(seeds=(0,), eval_each_epoch=False), data={"train_per_class": 0, "test_per_class": 0})
    stage = progress.StageProgress(
        cfg,
        "single-fp32",
        10,
        20,
        "cpu",
        enabled=True,
        warmup_steps=1,
        min_timed_s=0.0,
        min_timed_steps=1,
        models_dir=tmp_path / "models",
        work_dir=tmp_path / "work",
        params_file=tmp_path / "params.yaml",
    )
    stage.start_seed(0)
    with caplog.at_level("INFO", logger="ampbench.training.progress"):
        for _ in range(3):
            if stage.step():
                stage.report()
    stage.close()
    (line,) = [r.getMessage() for r in caplog.records if "s per step" in r.getMessage()]
    assert ("whole study" in line) == (scope != "variant"), line


def test_a_later_command_of_the_process_counts_its_start_up_from_its_own_start():
    """`ampbench variant` runs train then evaluate in one process: evaluate's start-up is not the
    training before it."""
    from ampbench import timing

    assert timing.StageClock().startup > 0.5  # the test process's age: imports and earlier tests
    timing.command_starts()
    try:
        time.sleep(0.05)
        assert 0.04 < timing.StageClock().startup < 0.5
    finally:
        timing._command_start.clear()


def test_a_gpus_estimate_waits_for_queued_steps_and_skips_the_first_evaluation(tmp_path: Path, monkeypatch):
    """On a GPU a step returns when queued, and the first evaluation autotunes its shapes: the
    estimate must count the steps' own time (not give it to the evaluation) and time the second
    evaluation, not the first (a 15 s stage of the H100 study was once estimated at 2 min)."""
    step_s, first_eval_s, eval_s, spe = 0.01, 0.3, 0.05, 20
    queued = [0.0]  # seconds of launched but unfinished device work

    def sync(device=None):
        time.sleep(queued[0])
        queued[0] = 0.0

    monkeypatch.setattr(progress, "sync", sync)
    cfg = _cfg(seeds=(0,), eval_each_epoch=True)
    stage = progress.StageProgress(
        cfg, "single-fp32", spe, 20, "cuda", enabled=False, warmup_steps=2, min_timed_s=60.0,
        models_dir=tmp_path / "models", work_dir=tmp_path / "work", params_file=tmp_path / "params.yaml",
    )  # fmt: skip
    stage.start_seed(0)
    for evaluation in (first_eval_s, eval_s):
        for _ in range(spe):
            queued[0] += step_s  # launched, not run
            assert not stage.step("cuda")  # the 60 s window never closes within the epoch
        sync()  # the evaluation waits for the steps, then runs
        time.sleep(evaluation)
        stage.epoch_done("cuda")
        assert stage.step_s == pytest.approx(step_s, rel=0.3)
        if evaluation == first_eval_s:
            assert stage.eval_s is None  # the first is warm-up: modelled from the step time
            assert stage.estimate["stage_left_seconds"] < 3 * (spe * step_s + eval_s)
    assert stage.eval_s == pytest.approx(eval_s, rel=0.5)
    assert stage.estimate["stage_left_seconds"] == pytest.approx(2 * (spe * stage.step_s + stage.eval_s))
    # and said in units a reader takes in (a GPU step was "0.000 s")
    assert (study_cost.fmt_step(0.0015), study_cost.fmt_step(0.412)) == ("1.50 ms", "0.412 s")
