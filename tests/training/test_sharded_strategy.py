"""The parallel strategy owns the model's state: the loop saves, resumes, evaluates and hands over
the final weights only through ``state_dict``, ``load_state_dict`` and ``unwrap``.

``FakeSharded`` is FSDP-shaped, on a CPU and in one process: the module it wraps answers its own
``state_dict()`` with this rank's half of each tensor (a shard), refuses a full ``load_state_dict``
and refuses a forward outside the training step, as a sharded module would give wrong or partial
state. Anything in the loop that reached around the strategy would save shards, fail to resume,
or fail to evaluate.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampbench import config
from ampbench.checkpoints.state import SeedCheckpoint
from ampbench.training import loop, parallel, precision
from ampbench.training.model import AlexNet
from conftest import REPO, crash_at_step, make_dataset


class _Inside(nn.Module):
    """What the fake's ``wrap`` and ``unwrap`` return: runs the module as its owner allows."""

    def __init__(self, module: nn.Module, owner: FakeSharded) -> None:
        super().__init__()
        self.module, self.owner = module, owner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.owner.inside += 1
        try:
            return self.module(x)
        finally:
            self.owner.inside -= 1


class FakeSharded(parallel.Single):
    name = "fake_sharded"

    def __init__(self, rank: int = 0) -> None:
        super().__init__()
        self.rank, self.world_size = rank, 2
        self.inside = 0  # > 0 while the module runs through the strategy
        self.gathering = False  # while the strategy itself reads or writes full state
        self.gathers = self.unwraps = 0

    def devices_used(self) -> int:
        return self.world_size

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        return t  # the other rank's share is zero: one process plays rank `rank`

    def wrap(self, model: nn.Module) -> nn.Module:
        for m in model.modules():
            m.register_forward_pre_hook(self._refuse_outside)
        model._register_state_dict_hook(self._shard)
        model.register_load_state_dict_pre_hook(self._refuse_full_load)
        return _Inside(model, self)

    def unwrap(self, model: nn.Module) -> nn.Module:
        self.unwraps += 1
        return _Inside(model.module if isinstance(model, _Inside) else model, self)

    def state_dict(self, model: nn.Module, optimizer=None) -> dict:
        self.gathers += 1
        self.gathering = True
        try:
            return super().state_dict(model, optimizer)
        finally:
            self.gathering = False

    def load_state_dict(self, model: nn.Module, state: dict, optimizer=None) -> None:
        self.gathering = True
        try:
            super().load_state_dict(model, state, optimizer)
        finally:
            self.gathering = False

    def _refuse_outside(self, module, args) -> None:
        if not self.inside:
            raise RuntimeError("reached around the strategy: a sharded module's forward outside it")

    def _shard(self, module, state: dict, prefix, local_metadata) -> dict:
        if self.gathering:
            return state
        return {k: v.chunk(2)[self.rank].clone() if v.dim() else v for k, v in state.items()}

    def _refuse_full_load(self, module, state, prefix, *args) -> None:
        if not self.gathering:
            raise RuntimeError("reached around the strategy: a full state loaded into a shard")


def _job(folder, strategy: FakeSharded, stop=lambda: False, **train) -> loop.Job:
    """One fp32 seed: 60 images, global batch 20 (this rank's 10), 3 steps per epoch, 3 epochs;
    the ranks agree (stop, save) at every step."""
    cfg = config.load_config(REPO / "params.yaml")
    train = {"epochs": 3, "batch_size": 20, "seeds": (0,), "lr": 0.05, "stop_check_every": 1, **train}
    cfg = config.replace(cfg, model={"fc_dim": 32}, train=train)
    strategy.setup()
    return loop.Job(
        cfg, precision.REGISTRY["fp32"], strategy, make_dataset(), 0, folder / "checkpoint.pt", stop
    )


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models train faster on one CPU thread (and two runs then sum in the same order)."""
    threads = torch.get_num_threads()
    yield torch.set_num_threads(1)
    torch.set_num_threads(threads)


def _full_shapes() -> dict:
    cfg = config.replace(config.load_config(REPO / "params.yaml"), model={"fc_dim": 32})
    return {k: v.shape for k, v in AlexNet(cfg.model, 10).state_dict().items()}


def test_the_fake_catches_a_loop_that_reaches_around_it():
    """Its teeth: the wrapped module's own state is a shard, and it cannot be run or loaded directly."""
    strategy, net = FakeSharded(), nn.Linear(4, 4)
    wrapped = strategy.wrap(net)
    assert net.state_dict()["weight"].shape == (2, 4)
    assert strategy.state_dict(net)["model"]["weight"].shape == (4, 4)
    with pytest.raises(RuntimeError, match="reached around"):
        net(torch.zeros(1, 4))
    with pytest.raises(RuntimeError, match="reached around"):
        net.load_state_dict(strategy.state_dict(net)["model"])
    assert wrapped(torch.zeros(1, 4)).shape == strategy.unwrap(net)(torch.zeros(1, 4)).shape == (1, 4)


def test_save_resume_and_evaluate_go_through_the_strategy(tmp_path):
    reference = loop.train_seed(_job(tmp_path / "reference", FakeSharded(), checkpoint_every_s=1e9))
    shapes = _full_shapes()
    assert {k: v.shape for k, v in reference["state_dict"].items()} == shapes  # model.pt's weights: full
    accuracies = [h["test_accuracy"] for h in reference["history"]]
    assert len(accuracies) == 3  # evaluated every epoch, through unwrap (a direct call raises)

    crashed = FakeSharded()
    with pytest.raises(RuntimeError, match="crash"):  # epoch 2's 2nd step, after a save at its 1st
        loop.train_seed(_job(tmp_path / "crashed", crashed, crash_at_step(5), checkpoint_every_s=1e-9))
    saved = SeedCheckpoint.load(tmp_path / "crashed" / "checkpoint.pt")
    assert (saved.epoch, saved.step) == (1, 1)
    assert {k: v.shape for k, v in saved.model.items()} == shapes  # the checkpoint: full, not a shard
    assert crashed.gathers >= 4  # each save took the state from the strategy

    resumed_by = FakeSharded()
    resumed = loop.train_seed(_job(tmp_path / "crashed", resumed_by, checkpoint_every_s=1e9), resume=saved)
    assert resumed_by.unwraps >= 2  # epochs 2 and 3 evaluated through it
    for name, value in reference["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], value), name  # resumed exactly
    assert [h["test_accuracy"] for h in resumed["history"]] == accuracies


def test_every_rank_takes_the_state_and_rank_zero_alone_writes_it(tmp_path):
    """Gathering is a collective: a rank that skipped it would hang the others. Rank 1 gathers at
    both epoch-end saves and for the final weights, and writes nothing."""
    rank1 = FakeSharded(rank=1)
    out = loop.train_seed(_job(tmp_path / "rank1", rank1, checkpoint_every_s=0.0))
    assert rank1.gathers == 2 + 1
    assert out["result"].checkpoints_written == 0 and not (tmp_path / "rank1" / "checkpoint.pt").exists()
    rank0 = FakeSharded(rank=0)
    out = loop.train_seed(_job(tmp_path / "rank0", rank0, checkpoint_every_s=0.0))
    assert rank0.gathers == 2 + 1 and out["result"].checkpoints_written == 2
    assert (tmp_path / "rank0" / "checkpoint.pt").exists()
