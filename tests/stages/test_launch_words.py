"""What the DDP launcher says when its workers were stopped (stages/launch.py): what is on disk,
not a promise. A hostile pass pressed Ctrl-C 2 s into a DDP stage: the workers were still starting,
saved nothing, and the launcher said "every DDP worker saved a checkpoint"."""

from __future__ import annotations

import os
from pathlib import Path

from ampbench.stages import launch

HINT = "To resume, run the same command."


def test_a_stop_before_the_first_checkpoint_says_nothing_was_saved(tmp_path: Path):
    work = tmp_path / "checkpoints" / "ddp-fp32"
    said = launch._what_was_saved(work, HINT)  # the folder does not even exist yet
    assert "nothing was saved" in said and "saved their work" not in said, said
    (work / "seed-0").mkdir(parents=True)  # a seed folder (run.json only) is no checkpoint
    (work / "seed-0" / "run.json").write_text("{}")
    assert "nothing was saved" in launch._what_was_saved(work, HINT)


def test_a_stop_after_a_checkpoint_names_where_it_is(tmp_path: Path):
    work = tmp_path / "checkpoints" / "ddp-fp32"
    (work / "seed-1").mkdir(parents=True)
    (work / "seed-1" / "checkpoint.pt").write_bytes(b"x")
    said = launch._what_was_saved(work, HINT)
    assert f"saved their work in {work}/" in said and said.endswith(HINT), said


def test_under_nohup_torchruns_agent_leaves_sighup_ignored(monkeypatch, tmp_path: Path):
    """Final pass K: `nohup make run`, then a hang-up during the DDP stage: torchrun's agent had
    put its own SIGHUP handler in and stopped the workers."""
    import signal

    import torch.distributed.run as torch_run

    from ampbench.config import load_config
    from ampbench.stages import launch
    from conftest import REPO

    seen = {}
    monkeypatch.setattr(
        torch_run, "main", lambda args: seen.update(env=torch_run.parse_args(args).signals_to_handle)
    )
    monkeypatch.delenv(ENV, raising=False)
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        launch.torchrun(["train"], load_config(REPO / "params.yaml"), tmp_path, "make run")
    finally:
        signal.signal(signal.SIGHUP, before)
        os.environ.pop(ENV, None)
    assert seen["env"] == "SIGTERM,SIGINT,SIGQUIT"


ENV = "PET_SIGNALS_TO_HANDLE"  # torchrun's --signals-to-handle


def test_a_stop_after_the_workers_published_every_seed_is_no_stop(monkeypatch, tmp_path: Path, caplog):
    """Hostile pass J: SIGTERM just after the last seed of a DDP stage: rank 0 said it "came after
    training's last step: every seed is trained and kept", then the launcher said "nothing was
    saved", 143, and its resume trained every seed again."""
    import signal

    import torch.distributed.run as torch_run
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from ampbench.config import load_config
    from conftest import REPO

    cfg = load_config(REPO / "params.yaml")
    monkeypatch.chdir(tmp_path)
    work = Path("checkpoints") / "ddp-fp32"

    def workers(args, published=True):
        for seed in cfg.train.seeds if published else cfg.train.seeds[:1]:
            (Path("models/ddp-fp32") / f"seed-{seed}").mkdir(parents=True, exist_ok=True)
            (Path("models/ddp-fp32") / f"seed-{seed}" / "model.pt").write_bytes(b"x")
        raise SignalException("stopped", sigval=signal.SIGTERM)

    monkeypatch.setattr(torch_run, "main", workers)
    assert launch.torchrun(["train"], cfg, work, HINT) == 0
    assert "stopped by" not in caplog.text  # said as rank 0 says it (pass K: rank 0 may be gone)
    assert "SIGTERM came after training's last step: every seed is trained and kept" in caplog.text
    monkeypatch.setattr(torch_run, "main", lambda args: workers(args, published=False))
    os.utime(Path("models/ddp-fp32/seed-1/model.pt"), (0, 0))  # an older study's, not this launch's
    monkeypatch.setattr(launch, "_fail_dangling_runs", lambda cfg, work: None)
    assert launch.torchrun(["train"], cfg, work, HINT) == 128 + signal.SIGTERM
    assert "stopped by SIGTERM: the DDP workers stopped before their first checkpoint" in caplog.text


def test_a_late_stop_of_launched_workers_is_said_once_by_the_launcher(monkeypatch, tmp_path: Path, caplog):
    """Hostile pass O: SIGINT to a DDP stage's group right at its last seed line: rank 0 said
    "came after training's last step", and the launcher said it again (3 tries in 3)."""
    import signal

    import torch.distributed.run as torch_run
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from ampbench import interrupts
    from ampbench.config import load_config
    from ampbench.stages import stop
    from conftest import REPO

    cfg = load_config(REPO / "params.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(stop, "watch_launcher", lambda on_gone: None)
    monkeypatch.setattr(interrupts, "_told", False)
    monkeypatch.setattr(interrupts, "within", False)  # rank 0's own say, not a command's
    for key in ("RANK", "LOCAL_RANK"):
        monkeypatch.setenv(key, "0")

    def rank_0_then_the_agents_stop(args):
        for seed in cfg.train.seeds:  # every seed published, then the stop after the last step
            (Path("models/ddp-fp32") / f"seed-{seed}").mkdir(parents=True, exist_ok=True)
            (Path("models/ddp-fp32") / f"seed-{seed}" / "model.pt").write_bytes(b"x")
        flag = stop.StopFlag()
        flag()
        os.kill(os.getpid(), signal.SIGINT)
        flag.close(completed=True)  # as rank 0 of this launcher's workers
        raise SignalException("stopped", sigval=signal.SIGINT)

    monkeypatch.setattr(torch_run, "main", rank_0_then_the_agents_stop)
    assert launch.torchrun(["train"], cfg, Path("checkpoints") / "ddp-fp32", HINT) == 0
    assert caplog.text.count("came after training's last step") == 1, caplog.text
    assert stop.LAUNCHED_ENV not in os.environ  # the launcher's process keeps no trace of it
