"""Tests for the train stage: the nine variants end to end, DDP equivalence, autocast dtypes,
divergence as a result, and configuration errors.

End-to-end tests run `python -m ampbench train` as a subprocess in a throwaway project (tiny data,
tiny model) and read back what it wrote: ``model.pt`` and the MLflow runs (a variant run named
``<variant>`` with one nested seed run ``<variant>/seed-<s>`` per seed). The equivalence and dtype
tests call ampbench's own pieces in-process (``trainer.setup``/``trainer.make_step``, the loaders' per-rank
slicing, ``parallel.Distributed`` over gloo, ``Precision.apply``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from ampbench import config
from ampbench.config import PARALLELS, PRECISIONS
from ampbench.training import build, loader, loop, parallel, precision
from conftest import clean_env, free_port, make_dataset, mlflow_client, new_project, run_cli, runs

EPOCHS = 3  # the variant matrix trains 3 epochs: one value per epoch is then distinguishable
BATCH = 20  # TINY's global batch (conftest); 60 train images -> 3 steps per epoch
PER_EPOCH = ("train_loss", "train_accuracy", "test_accuracy", "epoch_seconds", "grad_scale", "skipped_steps")
SUMMARY = ("train_seconds", "peak_memory_mb", "first_epoch_seconds")
REQUIRED_PARAMS = (
    "train.batch_size",
    "variant",
    "amp_dtype",
    "world_size",
    "devices_used",
    "device_name",
    "torch_version",
    "tf32_matmul",
    "tf32_cudnn",
    "git_commit",
    "per_process_batch",
)
MODEL_PT_KEYS = {
    "state_dict",
    "config",
    "run_id",
    "variant_run_id",
    "config_digest",
    "result",
    "history",
    "pending_metrics",
}
# Flat keys (model.pt, DVC metrics) -> the sectioned names MLflow shows them under.
MLFLOW_NAME = {
    "train_loss": "train/loss",
    "train_accuracy": "train/accuracy",
    "test_accuracy": "test/accuracy",
    "epoch_seconds": "time/epoch_seconds",
    "epoch_images_per_second": "speed/epoch_images_per_second",
    "lr": "train/lr",
    "grad_scale": "amp/grad_scale",
    "skipped_steps": "amp/skipped_steps",
    "nonfinite_losses": "amp/nonfinite_losses",
    "train_seconds": "time/train_seconds",
    "first_epoch_seconds": "time/first_epoch_seconds",
    "images_per_second": "speed/images_per_second",
    "peak_memory_mb": "memory/peak_mb",
    "epochs_completed": "train/epochs_completed",
    "diverged": "train/diverged",
    "diverged_epoch": "train/diverged_epoch",
    "diverged_step": "train/diverged_step",
}
KIND = "ampbench.kind"  # variant | seed | compare


# ------------------------------------------------------------------------------------------ helpers
def _cpu_env() -> dict:
    """The stage subprocesses' environment, CPU only: the expectations below are CPU's."""
    return clean_env(CUDA_VISIBLE_DEVICES="")


def _model_pt(project: Path, variant: str, seed: int = 0) -> dict:
    path = project / "models" / variant / f"seed-{seed}" / "model.pt"
    assert path.is_file(), f"{path} was not written"
    saved = torch.load(path, map_location="cpu", weights_only=True)
    assert set(saved) >= MODEL_PT_KEYS, f"model.pt lacks {sorted(MODEL_PT_KEYS - set(saved))}"
    return saved


def _run_named(project: Path, name: str, kind: str):
    found = [r for r in runs(project) if r.info.run_name == name]
    assert len(found) == 1, f"expected one MLflow run named {name!r}, found {len(found)}"
    assert found[0].data.tags.get(KIND) == kind, found[0].data.tags
    return found[0]


def _seed_run(project: Path, variant: str, seed: int = 0):
    """The seed's run, nested under the variant's run (checked here for every caller)."""
    run = _run_named(project, f"{variant}/seed-{seed}", "seed")
    parent = _run_named(project, variant, "variant")
    assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
    return run


def _metric(run, key: str) -> float:
    """The latest value of a flat key, read under its sectioned MLflow name."""
    return run.data.metrics[MLFLOW_NAME[key]]


def _history(project: Path, run_id: str, key: str) -> dict[int, float]:
    """{step: value} of one metric (flat key); fails if a step was logged twice."""
    hist = mlflow_client(project).get_metric_history(run_id, MLFLOW_NAME[key])
    steps = [m.step for m in hist]
    assert len(steps) == len(set(steps)), f"{key}: a step was logged more than once: {sorted(steps)}"
    return {m.step: m.value for m in hist}


def _tiny_cfg(**train) -> config.Config:
    model = {"fc_dim": 32, "batch_norm": False, "dropout": 0.0}
    base = {
        "epochs": 2,
        "batch_size": BATCH,
        "lr": 0.05,
        "seeds": (0,),
        "workers": 0,
        "cuda_graph": False,
        "collective_timeout_s": 60.0,
    }
    return config.replace(config.Config(), model=model, train={**base, **train})


# ------------------------------------------------------------------ 1. the nine variants on CPU
class TrainedProject:
    """One project shared by the variant matrix; each variant is trained once, on first use."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.procs: dict[str, object] = {}

    def train(self, parallel_name: str, precision_name: str):
        variant = f"{parallel_name}-{precision_name}"
        if variant not in self.procs:
            args = ("train", "--parallel", parallel_name, "--precision", precision_name)
            self.procs[variant] = run_cli(self.path, *args, env=_cpu_env())
        return self.procs[variant]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> TrainedProject:
    return TrainedProject(new_project(tmp_path_factory.mktemp("matrix") / "proj", train={"epochs": EPOCHS}))


@pytest.mark.slow
@pytest.mark.parametrize("precision_name", PRECISIONS)
@pytest.mark.parametrize("parallel_name", PARALLELS)
def test_variant_trains_and_is_tracked(trained: TrainedProject, parallel_name: str, precision_name: str):
    variant = f"{parallel_name}-{precision_name}"
    proc = trained.train(parallel_name, precision_name)
    project = trained.path

    # model.pt: plain weights (weights_only=True), with everything evaluate needs
    saved = _model_pt(project, variant)
    result, history = saved["result"], saved["history"]
    assert saved["config"]["train"]["batch_size"] == BATCH
    assert sorted(p.name for p in (project / "models" / variant).rglob("*")) == ["model.pt", "seed-0"]
    assert not (project / "checkpoints" / variant).exists()  # the work folder is gone once published
    assert saved["pending_metrics"] == []  # the store took every epoch
    assert result["diverged"] is False
    assert result["epochs_completed"] == EPOCHS
    assert [h["epoch"] for h in history] == list(range(1, EPOCHS + 1))
    assert saved["state_dict"] and all(v.isfinite().all() for v in saved["state_dict"].values())

    # the MLflow runs: the seed run nested under the variant run; names, tags, status
    run = _seed_run(project, variant)
    assert run.info.run_id == saved["run_id"]
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert (tags["parallel"], tags["precision"], tags["diverged"]) == (parallel_name, precision_name, "false")
    assert tags["seed"] == "0"
    parent = _run_named(project, variant, "variant")
    assert parent.info.run_id == saved["variant_run_id"]
    assert parent.info.status == "FINISHED"
    assert (parent.data.tags["parallel"], parent.data.tags["precision"]) == (parallel_name, precision_name)
    assert parent.data.params["config_digest"] == saved["config_digest"]
    # flat keys nowhere in MLflow: every metric sits in a section (the UI groups charts by it)
    assert all("/" in key for key in run.data.metrics), sorted(run.data.metrics)

    # params
    params = run.data.params
    missing = [k for k in REQUIRED_PARAMS if k not in params]
    assert not missing, f"params missing: {missing}"
    assert all(params[k].strip() for k in REQUIRED_PARAMS), {k: params[k] for k in REQUIRED_PARAMS}
    assert params["variant"] == variant
    assert params["train.batch_size"] == str(BATCH)
    assert params["torch_version"] == torch.__version__
    assert (params["tf32_matmul"], params["tf32_cudnn"]) == ("False", "False")
    autocast = precision.REGISTRY[precision_name].dtype is not None  # tf32: fp32 activations
    assert params["amp_dtype"] == ("bfloat16" if autocast else "float32")  # CPU autocast: bfloat16
    assert result["amp_dtype"] == params["amp_dtype"]
    assert params["autocast_used"] == str(autocast)
    assert params["grad_scaler_used"] == str(precision_name == "autocast_gradscaler")
    if parallel_name == "ddp":
        assert params["world_size"] == "2"
        assert params["devices_used"] == "2"
        assert params["per_process_batch"] == str(BATCH // 2)
        assert "ddp: no GPU" in proc.stderr
    else:
        assert params["world_size"] == "1"
        assert params["devices_used"] == "1"
        assert params["per_process_batch"] == str(BATCH)
    if parallel_name == "dp":
        assert "dp:" in proc.stderr and "devices_used=1" in proc.stderr, proc.stderr[-3000:]

    # per-epoch metrics: exactly one value per epoch, matching model.pt's history
    epochs = list(range(1, EPOCHS + 1))
    for key in PER_EPOCH:
        values = _history(project, run.info.run_id, key)
        assert sorted(values) == epochs, f"{key}: steps {sorted(values)}"
        for h in history:
            assert values[h["epoch"]] == pytest.approx(h[key], rel=1e-9, abs=1e-12), key
    per_epoch_ips = _history(project, run.info.run_id, "epoch_images_per_second")
    assert sorted(per_epoch_ips) == epochs
    assert all(per_epoch_ips[e] > 0 for e in epochs)
    ips = _history(project, run.info.run_id, "images_per_second")
    assert list(ips) == [EPOCHS]  # the summary only (epochs 2..N), at the last epoch's step
    grad_scale = _history(project, run.info.run_id, "grad_scale")
    skipped = _history(project, run.info.run_id, "skipped_steps")
    if precision_name == "autocast_gradscaler":
        assert all(grad_scale[e] > 1.0 for e in epochs), grad_scale  # a live GradScaler on CPU
    else:
        assert all(grad_scale[e] == 1.0 for e in epochs), grad_scale
        assert all(skipped[e] == 0 for e in epochs), skipped
    assert all(
        0 <= v <= 1
        for k in ("train_accuracy", "test_accuracy")
        for v in _history(project, run.info.run_id, k).values()
    )

    # summary metrics: logged once, equal to model.pt's result
    assert ips[EPOCHS] == pytest.approx(result["images_per_second"])
    for key in SUMMARY:
        values = _history(project, run.info.run_id, key)
        assert len(values) == 1, f"{key}: {values}"
        assert next(iter(values.values())) == pytest.approx(result[key]), key
        assert result[key] > 0, key
    assert result["first_epoch_seconds"] == pytest.approx(history[0]["epoch_seconds"])
    assert result["train_seconds"] == pytest.approx(sum(h["epoch_seconds"] for h in history))
    assert _metric(run, "diverged") == 0


@pytest.mark.slow
def test_mlflow_run_shows_summary_images_per_second(trained: TrainedProject):
    trained.train("single", "fp32")
    saved = _model_pt(trained.path, "single-fp32")
    steady = [h["epoch_images_per_second"] for h in saved["history"][1:]]
    if len(steady) < 2 or steady[-1] == pytest.approx(saved["result"]["images_per_second"]):
        pytest.fail("precondition: the summary must differ from the last epoch's value")  # not an xfail
    run = _seed_run(trained.path, "single-fp32")
    assert _metric(run, "images_per_second") == pytest.approx(saved["result"]["images_per_second"])


# --------------------------------------------------- 2. DDP (B/2 per rank) == one process (B)
def _sgd_steps(cfg: config.Config, strategy) -> dict:
    """A few real training steps with ampbench's own setup, loader slicing and Step."""
    t, seed = cfg.train, cfg.train.seeds[0]
    dataset = make_dataset()
    torch.manual_seed(seed)  # identical initial weights in every process, as in trainer.train_seed
    batches = loader.make(t.loader, dataset, t.batch_size, strategy, seed, t.workers)
    prec = precision.REGISTRY["fp32"]
    trainer = build.setup(cfg, prec, strategy, 10, t.epochs * len(batches))
    initial = {k: v.detach().clone() for k, v in trainer.raw_model.state_dict().items()}
    step = build.make_step(trainer, cfg, strategy)
    trainer.model.train()
    for epoch in range(t.epochs):
        for images, labels in batches.epoch(epoch):
            assert len(labels) == t.batch_size // strategy.world_size
            step(images, labels)
            trainer.sched.step()
    totals = step.stats.totals(strategy)
    return {
        "initial": initial,
        "final": trainer.raw_model.state_dict(),
        "stats": dataclasses.asdict(totals),
        "wrapper": type(trainer.model).__name__,
        "steps": t.epochs * len(batches),
    }


def _ddp_rank(rank: int, world: int, port: int, cfg: config.Config, out_dir: str) -> None:
    """One torch.multiprocessing worker: parallel.Distributed over gloo, from env vars."""
    env = {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": world, "LOCAL_WORLD_SIZE": world}
    os.environ.update({k: str(v) for k, v in env.items()}, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    strategy = parallel.Distributed(cfg.train.collective_timeout_s)
    strategy.setup()
    try:
        out = _sgd_steps(cfg, strategy)
        torch.save(out, Path(out_dir) / f"rank-{rank}.pt")
        strategy.barrier()
    finally:
        strategy.teardown()


def test_ddp_half_batches_match_single_process_full_batch(tmp_path, monkeypatch):
    # Real augmentation. No BN (per-replica batch statistics), no dropout (per-rank masks): same math.
    cfg = _tiny_cfg(epochs=2)
    world = 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the spawned ranks use gloo on CPU
    # Forked ranks share the torch this process imported (spawned ones import it again: half the
    # test's CPU seconds). With CUDA, spawn: a fork cannot re-read CUDA_VISIBLE_DEVICES.
    start = "spawn" if torch.cuda.is_available() else "fork"
    args = (world, free_port(), cfg, str(tmp_path))
    torch.multiprocessing.start_processes(_ddp_rank, args, nprocs=world, start_method=start)

    ref = _sgd_steps(cfg, parallel.Single(cfg.train.collective_timeout_s))  # CPU: setup() not called
    assert ref["wrapper"] == "AlexNet" and ref["steps"] == 6

    ranks = [torch.load(tmp_path / f"rank-{r}.pt", weights_only=True) for r in range(world)]
    for r, out in enumerate(ranks):
        assert out["wrapper"] == "DistributedDataParallel"
        assert out["steps"] == ref["steps"]
        for key, value in ref["initial"].items():
            torch.testing.assert_close(out["initial"][key], value, rtol=0, atol=0, msg=f"rank {r} init {key}")
        # the gloo all-sum of per-epoch stats counts the same images, loss and hits as one process
        assert out["stats"]["count"] == ref["stats"]["count"] == BATCH * ref["steps"]
        assert out["stats"]["correct"] == ref["stats"]["correct"]
        torch.testing.assert_close(out["stats"]["loss_sum"], ref["stats"]["loss_sum"], rtol=1e-5, atol=1e-5)
    moved = max((ref["final"][k] - ref["initial"][k]).abs().max().item() for k in ref["final"])
    assert moved > 1e-3, "the steps did not change the weights: the comparison would prove nothing"
    for key, value in ref["final"].items():
        for r, out in enumerate(ranks):
            torch.testing.assert_close(out["final"][key], value, rtol=1e-4, atol=1e-5, msg=f"rank {r}: {key}")
        torch.testing.assert_close(ranks[1]["final"][key], ranks[0]["final"][key], rtol=0, atol=0)


def test_loader_rank_slices_match_single_process():
    ds, cpu = make_dataset(), torch.device("cpu")
    args = (ds["train_images"], ds["train_labels"], BATCH)
    steps = len(ds["train_labels"]) // BATCH  # 60 images, batch 20: 3 full batches
    one = list(loader.DeviceLoader(*args, 0, 1, cpu, 0).epoch(0))
    halves = [list(loader.DeviceLoader(*args, r, 2, cpu, 0).epoch(0)) for r in range(2)]
    assert steps == 3 and len(one) == steps and [len(h) for h in halves] == [steps, steps]
    for images, labels in one:
        assert images.shape == (BATCH, 3, 32, 32) and images.dtype == torch.uint8 and labels.shape == (BATCH,)
    for half in halves:
        assert all(len(labels) == BATCH // 2 for _, labels in half)
    # one epoch shows every image at most once: 60 distinct samples, 6 per class
    seen = torch.cat([labels for _, labels in one])
    assert torch.bincount(seen, minlength=10).tolist() == [6] * 10
    for step, (_, labels) in enumerate(one):
        torch.testing.assert_close(torch.cat([h[step][1] for h in halves]), labels)  # same samples
    for step, (images, _) in enumerate(one):
        torch.testing.assert_close(torch.cat([h[step][0] for h in halves]), images, rtol=0, atol=0)
    # resuming mid-epoch yields the rest of the same epoch
    rest = list(loader.DeviceLoader(*args, 0, 1, cpu, 0).epoch(0, start_step=1))
    assert len(rest) == steps - 1
    torch.testing.assert_close(rest[0][1], one[1][1])


# ---------------------------------------------------------- 3. the autocast dtype inside forward
def _record_dtypes(model: nn.Module) -> list:
    seen = []
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            m.register_forward_hook(lambda mod, args, out: seen.append((out.device, out.dtype)))
    return seen


@pytest.mark.parametrize(
    ("precision_name", "expected"),
    # CPU autocast runs bfloat16 for every autocast precision (precision.CPU_AUTOCAST_DTYPE).
    [(name, torch.float32 if p.dtype is None else torch.bfloat16) for name, p in precision.REGISTRY.items()],
)
def test_autocast_dtype_inside_forward_on_cpu(precision_name, expected):
    cpu = torch.device("cpu")
    cfg = _tiny_cfg()
    model = build.build_model(cfg, 10, cpu)
    run = precision.REGISTRY[precision_name].setup(model, cpu)
    assert run.facts["amp_dtype"] == str(expected).removeprefix("torch.")
    seen = _record_dtypes(model)
    images = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    with torch.no_grad():
        out = run.wrap(model)(images)  # no outer autocast: the precision's wrapper enters it
    assert len(seen) == 8  # 5 convolutions + 3 linear layers
    assert {dtype for _, dtype in seen} == {expected}
    assert out.dtype == torch.float32 and out.shape == (2, 10)


def test_each_precision_names_its_cuda_dtype_and_scaler():
    """What runs on a GPU (dtype_on needs no GPU): the tutorial's float16 twice, bfloat16 once."""
    cuda = torch.device("cuda")
    found = {name: (p.dtype_on(cuda), p.grad_scaler) for name, p in precision.REGISTRY.items()}
    assert found == {
        "fp32": (None, False),
        "tf32": (None, False),
        "autocast": (torch.float16, False),
        "autocast_gradscaler": (torch.float16, True),
        "autocast_bf16": (torch.bfloat16, False),
    }


@pytest.mark.gpu
@pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason="DataParallel dtype check needs >= 2 CUDA GPUs (replica threads); none here",
)
def test_autocast_dtype_inside_dataparallel_replicas():
    cfg = _tiny_cfg()
    strategy = parallel.DataParallel(cfg.train.collective_timeout_s)
    device = strategy.setup()
    raw = build.build_model(cfg, 10, device)
    # bfloat16, not autocast's default float16: a replica that lost the dtype would show float16.
    run = precision.REGISTRY["autocast_bf16"].setup(raw, device)
    model = strategy.wrap(run.wrap(raw))
    assert isinstance(model, nn.DataParallel)
    seen = _record_dtypes(raw)  # replicas share the hooks of the module they copy
    n = torch.cuda.device_count()
    images = torch.randint(0, 256, (2 * n, 3, 32, 32), dtype=torch.uint8, device=device)
    with torch.no_grad():
        out = model(images)
    assert len({dev for dev, _ in seen}) == n, "every replica must have run"
    assert {dtype for _, dtype in seen} == {torch.bfloat16}, seen
    assert out.dtype == torch.float32


# ------------------------------------------------------------ 4. divergence is a result, not a crash
@pytest.mark.slow
def test_divergence_is_recorded_and_the_pipeline_goes_on(project: Path):
    variant = "single-autocast"
    # 1000000, not 1e6: YAML 1.1 reads 1e6 as a string (see the report on config overrides)
    args = ("--parallel", "single", "--precision", "autocast")
    run_cli(project, "train", *args, "--set", "train.lr=1000000", env=_cpu_env())

    saved = _model_pt(project, variant)
    result = saved["result"]
    assert result["diverged"] is True
    assert result["diverged_epoch"] >= 1 and result["diverged_step"] >= 0
    assert result["epochs_completed"] == result["diverged_epoch"] == len(saved["history"])
    assert not (project / "checkpoints" / variant).exists()

    run = _seed_run(project, variant)
    assert run.info.run_id == saved["run_id"]
    assert run.info.status == "FINISHED"
    assert run.data.tags["diverged"] == "true"
    assert _metric(run, "diverged") == 1
    assert _metric(run, "diverged_epoch") == result["diverged_epoch"]
    assert _metric(run, "diverged_step") == result["diverged_step"]
    assert sorted(_history(project, run.info.run_id, "train_loss")) == list(
        range(1, result["diverged_epoch"] + 1)
    )

    run_cli(project, "evaluate", *args, env=_cpu_env())  # fails the test on a non-zero exit
    metrics = json.loads((project / "reports" / "metrics" / f"{variant}.json").read_text())
    assert metrics["diverged_runs"] == 1
    assert metrics["seeds"][0]["diverged"] is True and metrics["seeds"][0]["run_id"] == saved["run_id"]
    assert mlflow_client(project).get_run(saved["run_id"]).info.status == "FINISHED"
    variant_run = mlflow_client(project).get_run(saved["variant_run_id"])
    assert variant_run.data.metrics["train/diverged_runs"] == 1  # the variant's row shows it too


# Slow: six steps of bfloat16 autocast with GradScaler, emulated on CPUs without native bfloat16.
@pytest.mark.slow
def test_epoch_without_a_finite_loss_has_no_train_loss(tmp_path):
    # GradScaler skips every step once the weights blew up, so this is not `diverged` (the scale
    # is still above train.scale_floor), but the epoch has no finite loss to average.
    cfg = _tiny_cfg(epochs=2, lr=1.0e6, checkpoint_every_s=60.0)
    job = loop.Job(
        cfg,
        precision.REGISTRY["autocast_gradscaler"],
        parallel.Single(),
        make_dataset(),
        0,
        tmp_path / "checkpoint.pt",
    )
    last = loop.train_seed(job)["history"][-1]
    steps = len(make_dataset()["train_labels"]) // BATCH
    if last["nonfinite_losses"] != steps:
        pytest.fail(f"precondition: every loss of the last epoch must be non-finite: {last}")
    assert math.isnan(last["train_loss"]), last


# ------------------------------------------------------------------- 5. configuration errors
def test_short_runs_get_a_valid_schedule_or_a_clear_error(tmp_path):
    """One epoch of 5 steps trains (warm-up stretched to 1.5 steps); 3 steps are refused clearly."""
    cfg = _tiny_cfg(epochs=1, batch_size=12, checkpoint_every_s=60.0)
    job = loop.Job(
        cfg, precision.REGISTRY["fp32"], parallel.Single(), make_dataset(), 0, tmp_path / "checkpoint.pt"
    )
    assert loop.train_seed(job)["result"].epochs_completed == 1
    job.cfg = _tiny_cfg(epochs=1, batch_size=20)
    with pytest.raises(ValueError, match="only 3 training steps .* needs at least 4"):
        loop.train_seed(job)


@pytest.mark.slow
def test_ddp_runs_unchanged_under_an_outer_torchrun(project: Path):
    """The same `ampbench train --parallel ddp` command, started as workers of torchrun itself."""
    import subprocess
    import sys

    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
    ]
    cmd = [*torchrun, "-m", "ampbench", "train", "--parallel", "ddp", "--precision", "fp32"]
    proc = subprocess.run(cmd, cwd=project, env=_cpu_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "launching" not in proc.stderr  # it did not start a second torchrun inside
    saved = _model_pt(project, "ddp-fp32")
    run = _seed_run(project, "ddp-fp32")
    assert run.info.run_id == saved["run_id"]
    assert run.data.params["world_size"] == "2"
    assert run.info.status == "FINISHED"


def test_momentum_buffers_start_at_zero():
    """Fused SGD would create them uninitialised on a first step GradScaler skips (CUDA)."""
    cfg = _tiny_cfg()
    prec = precision.REGISTRY["autocast_gradscaler"]
    trainer = build.setup(cfg, prec, parallel.Single(), 10, 10)
    raw, opt = trainer.raw_model, trainer.opt
    params = list(raw.parameters())
    assert params and all("momentum_buffer" in opt.state[p] for p in params)
    for p in params:
        torch.testing.assert_close(opt.state[p]["momentum_buffer"], torch.zeros_like(p), rtol=0, atol=0)


def test_graph_capture_follows_the_strategy(monkeypatch):
    """CUDA graphs where the wrapper allows them: not on CPU, not for DataParallel over 2+ GPUs."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    strategies = [parallel.Single(), parallel.DataParallel(), parallel.Distributed()]
    assert not any(s.capturable() for s in strategies)  # CPU: no graphs
    for s in strategies:
        s.device = torch.device("cuda", 0)  # capturable() only looks at the device and GPU count
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert [s.capturable() for s in strategies] == [True, True, True]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [s.capturable() for s in strategies] == [True, False, True]  # DP replicas run in threads
    # DDP needs more eager iterations before capture than a plain module.
    assert strategies[2].graph_warmup_steps > strategies[0].graph_warmup_steps


def test_ddp_world_of_one_checks_stop_without_a_collective(monkeypatch):
    """No all-reduce (and no host sync) per step when one process has nobody to agree with."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    strategy = parallel.Distributed()
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda *a, **k: pytest.fail("all_reduce called"))
    assert strategy.any(True) is True and strategy.any(False) is False


def _param_and_sgd() -> tuple[nn.Parameter, torch.optim.Optimizer]:
    w = nn.Parameter(torch.ones(3))
    return w, torch.optim.SGD([w], lr=0.1)


@pytest.mark.parametrize("bad", [False, True])
def test_precision_run_says_whether_gradscaler_skipped_the_step(bad: bool):
    """optimizer_step returns the scaler's own found-inf flag, read before update() resets it."""
    w, opt = _param_and_sgd()
    run = precision.REGISTRY["autocast_gradscaler"].setup(nn.Linear(1, 1), torch.device("cpu"))
    assert float(run.scale()) == 1.0  # GradScaler makes its scale tensor on the first backward
    run.backward((w * torch.tensor([1.0, float("inf") if bad else 2.0, 3.0])).sum())
    skipped = run.optimizer_step(opt)
    assert isinstance(skipped, torch.Tensor) and float(skipped) == float(bad)
    assert torch.equal(w.detach(), torch.ones(3)) == bad  # skipped: weights untouched
    assert float(run.scale()) == (2.0**15 if bad else 2.0**16)  # a skip halves the initial 2**16
    assert not run.diverged(nonfinite_losses=1, scale_floor=1.0)  # skips are the scaler's job
    assert run.diverged(nonfinite_losses=0, scale_floor=2.0**17)  # a collapsed scale is not


def test_precision_run_without_a_scaler_and_the_scalers_state():
    cpu = torch.device("cpu")
    w, opt = _param_and_sgd()
    plain = precision.REGISTRY["fp32"].setup(nn.Linear(1, 1), cpu)
    plain.backward((w * 2).sum())
    assert plain.optimizer_step(opt) is None and not torch.equal(w.detach(), torch.ones(3))
    assert float(plain.scale()) == 1.0 and plain.state_dict() == {}
    assert plain.diverged(nonfinite_losses=1, scale_floor=1e30) and not plain.diverged(0, 1e30)
    scaled = precision.REGISTRY["autocast_gradscaler"].setup(nn.Linear(1, 1), cpu)
    scaled.backward((w * float("inf")).sum())
    scaled.optimizer_step(opt)  # skipped: the scale halves
    resumed = precision.REGISTRY["autocast_gradscaler"].setup(nn.Linear(1, 1), cpu)
    resumed.load_state_dict(scaled.state_dict())  # what a checkpoint's "scaler" entry restores
    assert resumed.state_dict() == scaled.state_dict() and scaled.state_dict()["scale"] == 2.0**15
