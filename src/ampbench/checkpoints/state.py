"""What a seed's files hold, typed: ``SeedCheckpoint`` (``checkpoint.pt``, while the seed trains)
and ``ModelFile`` (``model.pt``, once it is done). Every reader and writer goes through them.

On disk each is one flat dict of tensors and plain Python values (it loads with
``torch.load(weights_only=True)``), plus ``format`` (bumped whenever a field is added, removed or
changes meaning; files without it are format 1, the untyped dicts of older versions) and ``kind``.
``load`` refuses a file of another format or kind, or one missing a field, with a
``files.CheckpointError`` that names the file, what is wrong and what to do.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar, Self

import torch

from ampbench import atomic
from ampbench.checkpoints import files
from ampbench.seed_result import SeedResult


class _SavedFile:
    """save / load / validation shared by the file kinds below (each a dataclass)."""

    KIND: ClassVar[str]
    FORMAT: ClassVar[int]

    def to_dict(self) -> dict:
        """What goes on disk: every field (tensors not copied), with ``format`` and ``kind``."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {"format": self.FORMAT, "kind": self.KIND, **values}

    def save(self, path: Path) -> None:
        """Atomically (temp file, fsync, rename: files.save); raises CheckpointError."""
        files.save(self.to_dict(), path)

    @classmethod
    def load(cls, path: Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> Self:
        """Read and validate `path`; FileNotFoundError if it is missing, else CheckpointError.
        ``mmap``: the tensors are mapped, not read (``files.load``).

        Also removes the temp files that writers killed mid-save (kill -9, OOM killer) left beside
        it: a resumed seed may train for long before its next save would remove them.
        """
        with suppress(OSError):  # a read-only folder still reads
            atomic.remove_stale_temps(Path(path))
        raw = files.load(path, map_location, mmap)
        problem = cls._problem(raw)
        if problem:
            raise files.CheckpointError(f"{path} {problem}; {cls._fix(path)}")
        try:
            values = cls._decode({f.name: raw[f.name] for f in fields(cls)})
        except (TypeError, AttributeError) as err:  # e.g. a result without train_seconds
            raise files.CheckpointError(f"{path} holds a damaged field ({err}); {cls._fix(path)}") from None
        return cls(**values)

    @classmethod
    def _decode(cls, values: dict) -> dict:
        """The fields as read from disk, turned into their in-memory types (a kind may override)."""
        return values

    @classmethod
    def _problem(cls, raw: object) -> str | None:
        if not isinstance(raw, dict):
            return f"holds a {type(raw).__name__}, not an ampbench {cls.KIND} file"
        if "kind" in raw and raw["kind"] != cls.KIND:  # first: the wrong file says more than its age
            return f"is a {raw.get('kind')!r} file, not a {cls.KIND} file"
        version = raw.get("format", 1)
        if version != cls.FORMAT:
            age = "another"
            if isinstance(version, int):
                age = "an older" if version < cls.FORMAT else "a newer"
            return (
                f"was written by {age} ampbench ({cls.KIND} format {version!r}; this one reads {cls.FORMAT})"
            )
        if raw.get("kind") != cls.KIND:
            return f"is a {raw.get('kind')!r} file, not a {cls.KIND} file"
        missing = [f.name for f in fields(cls) if f.name not in raw]
        if missing:
            return f"lacks {', '.join(missing)} (damaged or edited)"
        return None

    @classmethod
    def _fix(cls, path: Path) -> str:
        raise NotImplementedError

    def matches(self, digest: str, variant: str) -> bool:
        """Written by this configuration (Config.digest) and variant: safe to continue or reuse."""
        return (self.config_digest, self.variant) == (digest, variant)


@dataclass
class SeedCheckpoint(_SavedFile):
    """``checkpoint.pt``: a seed part-way through training, enough to continue it exactly."""

    KIND: ClassVar[str] = "checkpoint"
    FORMAT: ClassVar[int] = 3  # 3: joules

    epoch: int
    """Epochs completed: training continues in this epoch (0-based)."""
    step: int
    """Steps of `epoch` already taken: 0 at an epoch end, > 0 when saved mid-epoch (stop or timer)."""
    stats: list[float] | None
    """The partial epoch's statistics (step.Stats.snapshot) when saved mid-epoch, else None."""
    elapsed: float
    """Training seconds of the partial epoch so far: its epoch_seconds goes on from there."""
    joules: float | None
    """The partial epoch's energy so far (J, NVML; every rank's GPUs); None where not measured."""
    history: list[dict]
    """One record per completed epoch (step.epoch_metrics, plus test_accuracy)."""
    model: dict
    """The raw model's state_dict (build.Trainer.state)."""
    optimizer: dict
    """The optimizer's state_dict: momentum buffers and the learning rate."""
    scheduler: dict
    """The one-cycle schedule's state_dict: where in the schedule the seed is."""
    scaler: dict
    """The GradScaler's state_dict: scale and growth tracker (empty when disabled)."""
    rng_cpu: torch.Tensor
    """torch's CPU RNG state at the save (a record: the loop re-seeds at every epoch start)."""
    seed: int
    """The seed this checkpoint trains (train.seeds)."""
    run_id: str | None
    """The seed's MLflow run, which a resume continues (None: trained without tracking)."""
    config_digest: str
    """Config.digest of the configuration it trains: another one refuses to resume it."""
    variant: str
    """`<parallel>-<precision>`: another variant refuses to resume it."""
    hooks: list | None
    """Epoch metrics the tracking store had not taken yet (EpochHooks.state): a resume sends them."""

    @classmethod
    def _fix(cls, path: Path) -> str:
        return (
            "delete it, or pass --fresh (ampbench train ... --fresh) to discard it and train "
            "the seed from the start"
        )

    def trainer_state(self) -> dict:
        """What build.Trainer.load takes (the keys of Trainer.state)."""
        return {
            "model": self.model,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "scaler": self.scaler,
        }


@dataclass
class ModelFile(_SavedFile):
    """``model.pt``: a trained seed, with what evaluating and reporting it needs."""

    KIND: ClassVar[str] = "model"
    FORMAT: ClassVar[int] = 2

    state_dict: dict
    """The trained model's weights (the raw AlexNet's state_dict)."""
    config: dict
    """The whole configuration it was trained with (dataclasses.asdict of config.Config)."""
    variant: str
    """`<parallel>-<precision>`: evaluate refuses to score it as another variant."""
    seed: int
    """The seed it was trained with: evaluate refuses to score it as another seed."""
    run_id: str
    """The seed's MLflow run: evaluation logs into it."""
    variant_run_id: str | None
    """The variant's MLflow run (the seed run's parent): evaluation logs the aggregates there."""
    config_digest: str
    """Config.digest of `config`: a re-run of the same stage skips a seed that has one."""
    classes: list[str]
    """Class names, in label order (the model's output order)."""
    result: SeedResult
    """The seed's training result: speed, memory, divergence, the seconds by part, facts (on disk
    the flat dict ``SeedResult.to_dict`` gives, as files written before the type hold it)."""
    history: list[dict]
    """One record per trained epoch (step.epoch_metrics, plus test_accuracy)."""
    pending_metrics: list | None
    """Epoch metrics the tracking store had not taken when training ended: a re-run sends them."""

    def to_dict(self) -> dict:
        return {**super().to_dict(), "result": self.result.to_dict()}

    @classmethod
    def _decode(cls, values: dict) -> dict:
        return {**values, "result": SeedResult.from_dict(values["result"])}

    @classmethod
    def _fix(cls, path: Path) -> str:
        variant = path.parent.parent.name  # <models or checkpoints>/<variant>/seed-<s>/model.pt
        parallel_name, _, precision_name = variant.partition("-")
        return (
            f"delete it and re-train: `ampbench train --parallel {parallel_name} --precision "
            f"{precision_name}` (or `dvc repro -f train@{variant}`)"
        )
