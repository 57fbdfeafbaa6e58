"""Typed, frozen configuration: every setting of ``params.yaml``, its default and what it means.

``params.yaml`` is the one source of defaults (tests/config/test_config.py checks that the dataclasses below
agree with it). ``load_config`` reads it, applies ``--set key=value`` overrides from the command line,
and validates everything before any side effect: unknown keys, wrong types and out-of-range values
are collected and reported together, each by its dotted key.

    cfg = load_config("params.yaml", overrides=["train.epochs=1"])

This module holds the settings, each documented beside its field; ``load.py`` reads and
type-checks the file, ``rules.py`` holds the ranges and bounds. None of them imports torch: a
command line or configuration error is answered at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field, fields

from ampbench.variants import AXES as VARIANT_AXES
from ampbench.variants import PARALLELS, PRECISIONS

__all__ = [
    "COMPILE_MODES",
    "CONDITIONS",
    "LOADERS",
    "MODEL_LOGGING",
    "PARALLELS",
    "PRECISIONS",
    "SEED_LIMIT",
    "SWITCHES",
    "VARIANT_AXES",
    "Config",
    "ConfigError",
    "DataConfig",
    "ModelConfig",
    "ReportConfig",
    "TrackingConfig",
    "TrainConfig",
    "replace",
]

LOADERS = ("device", "dataloader")
COMPILE_MODES = ("none", "default", "max-autotune-no-cudagraphs")  # train.compile
SWITCHES = ("auto", "always", "never")  # not on/off: YAML reads those as booleans
CONDITIONS = ("project", "tutorial", "demo")  # which study a run belongs to (tracking.conditions)
MODEL_LOGGING = ("reference", "export", "none")  # tracking.log_model
# training/loop.py seeds torch with (seed * 100_003 + epoch) * 4099 + rank, which must stay
# below 2**64 (torch.manual_seed / Generator.manual_seed overflow beyond): seeds below 2**31
# leave room for over 10**15 epochs. Seeds index repetitions of a run: 0 is the floor.
SEED_LIMIT = 2**31


class ConfigError(ValueError):
    """One or more invalid settings; the message lists every problem by dotted key."""


@dataclass(frozen=True)
class DataConfig:
    url: str = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    """Source: http(s) URL, file:// URL, local archive or ImageFolder folder."""
    sha256: str = ""
    """Optional sha256 of the source archive (the official URL is always MD5-checked)."""
    train_per_class: int = 0
    """Class-balanced train subset for quick runs; 0 keeps all 5,000 per class."""
    test_per_class: int = 0
    """Class-balanced test subset; 0 keeps all 1,000 per class."""
    image_size: int = 32
    """Side of the square images the prepared file holds: an ImageFolder's images of any size are
    resized to it at download (CIFAR's are 32). alexnet takes 32; torchvision models any size
    their pooling allows (ViTs: 224)."""
    retries: int = 3
    """Download attempts before giving up."""
    timeout_s: float = 60.0
    """Seconds a download may go without progress: one socket read may wait this long, and every
    window of this many seconds must bring min_rate_kib_s on average, or the attempt fails."""
    min_rate_kib_s: float = 10.0
    """Slowest download kept going, KiB/s averaged over each timeout_s window: a source that
    trickles (a byte every 20 s never trips the read timeout) fails within one window instead of
    taking days. 10 KiB/s still fetches CIFAR-10's 163 MiB (in 4.6 h); 0: no floor."""


@dataclass(frozen=True)
class ModelConfig:
    name: str = "alexnet"
    """The network (training/factory.py): alexnet (the study's, options below), torchvision:<name>
    (any torchvision classification model, untrained, the data's class count) or
    <module.path>:<factory> (your own: called with the class count, returns an nn.Module)."""
    fc_dim: int = 4096
    """Width of AlexNet's two hidden fully connected layers (tests shrink it; alexnet only)."""
    batch_norm: bool = True
    """BatchNorm after each convolution (stabilises large-batch and fp16 training)."""
    dropout: float = 0.0
    """Dropout before the fully connected layers; 0 disables it."""


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 20
    """Passes over the train set."""
    batch_size: int = 512
    """Global batch size, identical for every variant; DDP splits it across processes."""
    lr: float = 0.2
    """Peak learning rate of the one-cycle schedule."""
    momentum: float = 0.9
    """SGD (Nesterov) momentum."""
    weight_decay: float = 5.0e-4
    """L2 weight decay."""
    label_smoothing: float = 0.1
    """Cross-entropy label smoothing."""
    warmup_fraction: float = 0.2
    """Fraction of steps spent warming the learning rate up."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Each variant trains once per seed; results are reported as mean and std."""
    loader: str = "device"
    """device: uint8 data resident on the device, augmented there; dataloader: torch DataLoader."""
    workers: int = 8
    """DataLoader worker processes (loader: dataloader only)."""
    eval_each_epoch: bool = True
    """Measure test accuracy after every epoch (cheap with data on the device)."""
    compile: str = "none"
    """torch.compile (inductor) of the model inside the captured step: none, default, or
    max-autotune-no-cudagraphs (training/compiler.py). Not for dp over several GPUs (threads)."""
    cuda_graph: bool = True
    """Replay the training step from a CUDA graph where the strategy allows it (CUDA: single, dp
    on one GPU, ddp over NCCL; not dp over several GPUs, whose replicas run in threads)."""
    cudnn_benchmark: bool = True
    """Let cuDNN time its convolution algorithms for each shape once, then use the fastest (the
    search runs in the first eager steps, never inside a CUDA-graph capture or a timed window)."""
    channels_last: bool = True
    """Use channels_last memory format on CUDA (faster convolutions on tensor cores)."""
    ddp_cpu_workers: int = 2
    """Processes a plain `--parallel ddp` start launches when no GPU is present."""
    scale_floor: float = 1.0e-6
    """A GradScaler scale below this counts as divergence (no learning happens any more)."""
    checkpoint_every_s: float = 60.0
    """Checkpoint once this many seconds of training passed since the seed started or last saved
    (at the next step boundary or epoch end): a crash loses at most that much; 0: every epoch end."""
    eval_flip: bool = True
    """Test accuracy averages the logits of each image and its mirror image (flip test-time aug)."""
    stop_check_every: int = 20
    """Steps between checks that all DDP ranks still want to run (SIGTERM handling)."""
    collective_timeout_s: float = 300.0
    """A hung DDP collective fails after this many seconds."""
    dp_autocast_outside_forward: bool = False
    """Only to demonstrate the tutorial's claim 4 (docs/FINDINGS.md); never set it otherwise. True
    disables the model's in-forward autocast and wraps the step's forward and loss in an outer
    ``torch.autocast`` instead (the naive placement); ``replica_dtypes`` records what ran."""


@dataclass(frozen=True)
class TrackingConfig:
    experiment: str = "cifar10-amp"
    """MLflow experiment name."""
    log_model: str = "reference"
    """Each seed's model in MLflow's Models tab (evaluate stage): reference (an external model that
    points at models/<variant>/seed-<s>/model.pt: no copy of the weights, milliseconds), export (a
    servable torch.export program, weights copied into the store: 12-16 s per evaluate stage on an
    H200 host) or none."""
    preflight_timeout_s: float = 5.0
    """How long to wait for a remote tracking server before failing."""
    request_timeout_s: float = 10.0
    """Timeout of one tracking call during training (one retry): a dead server costs seconds."""
    system_metrics: str = "auto"
    """CPU/GPU utilisation and memory charts (MLflow system metrics) on the train runs:
    auto (with CUDA only), always or never."""
    conditions: str = "project"
    """Which study the runs belong to: project (params.yaml), tutorial (tutorial/) or demo (demo/);
    tagged on every variant and seed run (ampbench.conditions) so `ampbench findings` can tell them apart."""


@dataclass(frozen=True)
class ReportConfig:
    equivalence_margin_pts: float = 0.5
    """The accuracy difference (percentage points) small enough not to matter: `ampbench findings`
    calls a precision equivalent to fp32 when a two one-sided test (TOST, Welch, alpha 0.05)
    places the difference's 90% confidence interval inside plus or minus this margin."""


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    report: ReportConfig = field(default_factory=ReportConfig)

    def flat(self) -> dict[str, object]:
        """The whole config as {dotted.key: value}, for logging as MLflow params."""
        return {
            f"{s.name}.{f.name}": getattr(getattr(self, s.name), f.name)
            for s in fields(self)
            for f in fields(getattr(self, s.name))
        }

    # Settings that change when or how a run is recorded or checked, never what it computes: a run
    # stopped under one value resumes under another.
    NOT_DIGESTED = (
        "tracking.",
        "data.retries",
        "data.timeout_s",
        "data.min_rate_kib_s",
        "train.checkpoint_every_s",
        "train.stop_check_every",
        "train.collective_timeout_s",
    )

    def digest(self, exclude: tuple[str, ...] = NOT_DIGESTED) -> str:
        """Hash of everything that changes what training computes (for safe resume)."""
        flat = {k: v for k, v in self.flat().items() if not k.startswith(exclude)}
        return hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def digested(self) -> dict:
        """The settings ``digest`` covers, dotted keys: what a refusal names when digests differ."""
        return {k: v for k, v in self.flat().items() if not k.startswith(self.NOT_DIGESTED)}


def replace(cfg: Config, **sections: dict) -> Config:
    """A copy of cfg with some fields of some sections changed: replace(cfg, train={'epochs': 1})."""
    return dataclasses.replace(
        cfg, **{s: dataclasses.replace(getattr(cfg, s), **v) for s, v in sections.items()}
    )
