"""What each setting accepts: ranges, and bounds on values no machine could run.

``problems(cfg)`` checks a well-typed Config (``load`` has checked the types); every rule
that fails gives one line, ``<dotted.key>: <value> <why>``. Bounds keep absurd values (a model that
needs more memory than any machine has, a run that could never finish) from getting as far as
creating a run, a folder or a process.
"""

from __future__ import annotations

import re

from ampbench.config.settings import (
    COMPILE_MODES,
    CONDITIONS,
    LOADERS,
    MODEL_LOGGING,
    SEED_LIMIT,
    SWITCHES,
    VARIANT_AXES,
    Config,
)
from ampbench.config.strict import shown
from ampbench.output import hide_credentials

# model.name's forms (training/factory.py resolves them and lists torchvision's names on a miss).
MODEL_NAME = re.compile(r"alexnet|torchvision:\w+|[A-Za-z_][\w.]*:[A-Za-z_]\w*")
MODEL_NAME_RULE = (
    "is not a model: choose alexnet, torchvision:<name> (e.g. torchvision:resnet18; any "
    "torchvision classification model) or <module.path>:<factory> (your own, e.g. mypkg.nets:make_model)"
)
_SHA256_RULE = 'must be 64 hexadecimal characters or empty (all digits or a leading 0: quote it, "0123...")'

# CIFAR-10 (the sizes a subset setting of 0 means; other sources are estimated as CIFAR-10).
CIFAR_CLASSES, CIFAR_TRAIN_PER_CLASS = 10, 5000
# Epoch e of seed s draws its data order and augmentation from RNG seed s * 100_003 + e (training/
# loader.py, loop.py): from epoch 100_003 on, seed s would replay seed s + 1's epochs.
EPOCH_LIMIT = 100_000
# Training steps one seed may take: at 10,000 steps a second (far beyond the fastest step this
# model has taken anywhere, docs/BENCHMARKS.md) these alone are 11.6 days per seed.
STEP_LIMIT = 10**10
STEPS_PER_SECOND = 10_000
# Model memory while training: weights, gradients, momentum and one more copy (a DDP bucket, the
# fp16 cast of autocast), 4 bytes each per parameter; no machine this runs on has 1 TiB for that.
BYTES_PER_PARAMETER = 4 * 4
MODEL_MEMORY_LIMIT = 2**40


def problems(cfg: Config) -> list[str]:
    """Every range or bound cfg breaks, one line each (empty: all good)."""
    rules = _train_rules(cfg) + _other_rules(cfg)
    found = [f"{key}: {shown(_get(cfg, key))} {why}" for key, ok, why in rules if not ok]
    return found + _credentials(cfg.data.url) + _seed_ranges(cfg.train.seeds) + _bounds(cfg)


def _credentials(url: str) -> list[str]:
    """A user name or password in data.url, refused with the password hidden: urllib sends none,
    so the download was retried as a failed name lookup, then blamed on a server that was up, with
    the password in every line (hostile pass P); params.yaml and MLflow would keep it too."""
    hidden = hide_credentials(url)
    if hidden == url:
        return []
    return [
        f"data.url: {shown(hidden)} holds a user name or password, which ampbench does not send and "
        "would record in params, logs and MLflow: download the file yourself (`curl -u USER -O <url>`) "
        "and set data.url to its path"
    ]


def _train_rules(cfg: Config) -> list[tuple[str, bool, str]]:
    t = cfg.train
    return [
        ("train.epochs", t.epochs >= 1, "must be >= 1"),
        ("train.batch_size", t.batch_size >= 1, "must be >= 1"),
        ("train.lr", t.lr > 0, "must be > 0"),
        ("train.momentum", 0 <= t.momentum < 1, "must be in [0, 1)"),
        ("train.weight_decay", t.weight_decay >= 0, "must be >= 0"),
        ("train.label_smoothing", 0 <= t.label_smoothing < 1, "must be in [0, 1)"),
        ("train.warmup_fraction", 0 < t.warmup_fraction < 1, "must be in (0, 1)"),
        ("train.seeds", len(set(t.seeds)) == len(t.seeds), "must not repeat a seed"),
        ("train.loader", t.loader in LOADERS, f"must be one of {', '.join(LOADERS)}"),
        ("train.compile", t.compile in COMPILE_MODES, f"must be one of {', '.join(COMPILE_MODES)}"),
        (
            "train.compile",
            t.compile == "none" or not t.dp_autocast_outside_forward,
            "must be none with train.dp_autocast_outside_forward (the claim-4 demonstration runs eager)",
        ),
        ("train.workers", t.workers >= 0, "must be >= 0"),
        ("train.ddp_cpu_workers", t.ddp_cpu_workers >= 1, "must be >= 1"),
        ("train.scale_floor", t.scale_floor > 0, "must be > 0"),
        ("train.checkpoint_every_s", t.checkpoint_every_s >= 0, "must be >= 0 (0 = every epoch)"),
        ("train.stop_check_every", t.stop_check_every >= 1, "must be >= 1"),
        ("train.collective_timeout_s", t.collective_timeout_s > 0, "must be > 0"),
    ]


def _other_rules(cfg: Config) -> list[tuple[str, bool, str]]:
    d, m, k = cfg.data, cfg.model, cfg.tracking
    return [
        ("data.sha256", d.sha256 == "" or bool(re.fullmatch(r"[0-9a-fA-F]{64}", d.sha256)), _SHA256_RULE),
        ("data.url", bool(d.url.strip()), "must not be empty"),
        ("data.train_per_class", d.train_per_class >= 0, "must be >= 0 (0 = all)"),
        ("data.test_per_class", d.test_per_class >= 0, "must be >= 0 (0 = all)"),
        ("data.retries", d.retries >= 1, "must be >= 1"),
        ("report.equivalence_margin_pts", 0 < cfg.report.equivalence_margin_pts < 100, "must be in (0, 100)"),
        ("data.timeout_s", d.timeout_s > 0, "must be > 0"),
        ("data.min_rate_kib_s", d.min_rate_kib_s >= 0, "must be >= 0 (0 = no floor)"),
        ("data.image_size", 8 <= d.image_size <= 4096, "must be in [8, 4096] (pixels, square images)"),
        ("model.name", bool(MODEL_NAME.fullmatch(m.name)), MODEL_NAME_RULE),
        (
            "data.image_size",
            m.name != "alexnet" or d.image_size == 32,
            "must be 32 with model.name alexnet (its classifier takes the 2x2 map of a 32x32 image): "
            "set data.image_size: 32, or choose a model that takes other sizes (torchvision:resnet18)",
        ),
        ("model.fc_dim", m.fc_dim >= 1, "must be >= 1"),
        ("model.dropout", 0 <= m.dropout < 1, "must be in [0, 1)"),
        ("tracking.experiment", bool(k.experiment.strip()), "must not be empty"),
        (
            "tracking.experiment",
            len(k.experiment) <= EXPERIMENT_NAME_LIMIT,
            f"must be at most {EXPERIMENT_NAME_LIMIT} characters (MLflow keeps an experiment's name to "
            "500, and bench and explain add '-bench' and '-explain' to it)",
        ),
        ("tracking.preflight_timeout_s", k.preflight_timeout_s > 0, "must be > 0"),
        ("tracking.request_timeout_s", k.request_timeout_s > 0, "must be > 0"),
        ("tracking.system_metrics", k.system_metrics in SWITCHES, f"must be one of {', '.join(SWITCHES)}"),
        ("tracking.log_model", k.log_model in MODEL_LOGGING, f"must be one of {', '.join(MODEL_LOGGING)}"),
        ("tracking.conditions", k.conditions in CONDITIONS, f"must be one of {', '.join(CONDITIONS)}"),
    ]


EXPERIMENT_NAME_LIMIT = 500 - len("-explain")


def _seed_ranges(seeds: tuple[int, ...]) -> list[str]:
    """Seeds the RNG arithmetic can take (see SEED_LIMIT); checked here, before any run exists."""
    bad = [s for s in seeds if not 0 <= s < SEED_LIMIT]
    return [f"train.seeds: {shown(s)} must be in [0, {SEED_LIMIT - 1}]" for s in bad]


def alexnet_parameters(fc_dim: int, batch_norm: bool = True, num_classes: int = CIFAR_CLASSES) -> int:
    """Parameters of training/model.py's AlexNet, counted without building it (tests compare the two).

    Five 3x3 convolutions 3-64-192-384-256-256, each with a BatchNorm (scale and shift) or else a
    bias; then fully connected 1024 (256 channels x 2 x 2) -> fc_dim -> fc_dim -> num_classes.
    """
    channels = (3, 64, 192, 384, 256, 256)
    per_channel = 2 if batch_norm else 1  # BatchNorm's scale and shift, or the convolution's bias
    convs = sum(9 * c_in * c_out + per_channel * c_out for c_in, c_out in zip(channels, channels[1:]))
    linear = sum(
        n_in * n_out + n_out for n_in, n_out in ((1024, fc_dim), (fc_dim, fc_dim), (fc_dim, num_classes))
    )
    return convs + linear


def _bounds(cfg: Config) -> list[str]:
    """Values in range that no machine could run (checked only on values already in range)."""
    return [p for p in (_model_memory(cfg), _run_length(cfg)) if p]


def _model_memory(cfg: Config) -> str:
    m = cfg.model
    # Counted for the study's AlexNet only: other models are counted when built, not here (no torch).
    params = alexnet_parameters(m.fc_dim, m.batch_norm) if m.fc_dim >= 1 and m.name == "alexnet" else 0
    need = params * BYTES_PER_PARAMETER
    if need <= MODEL_MEMORY_LIMIT:
        return ""
    return (
        f"model.fc_dim: {shown(m.fc_dim)} makes a model of {params:,} parameters; training it needs "
        f"{need / 2**40:,.2f} TiB (weights, gradients, momentum and a copy, 4 bytes each), more than "
        f"the {MODEL_MEMORY_LIMIT // 2**40} TiB limit: no machine has that memory (the study's fc_dim "
        "4096 is 23.3 M parameters, 0.35 GiB)"
    )


def _run_length(cfg: Config) -> str:
    t = cfg.train
    if t.epochs > EPOCH_LIMIT:
        return (
            f"train.epochs: {shown(t.epochs)} must be <= {EPOCH_LIMIT}: epoch e of seed s draws its data "
            "order and augmentation from RNG seed s * 100003 + e, so a longer run would replay another "
            "seed's epochs (and this model converges in tens of epochs)"
        )
    images = (cfg.data.train_per_class or CIFAR_TRAIN_PER_CLASS) * CIFAR_CLASSES
    steps = t.epochs * (images // t.batch_size) if t.batch_size >= 1 else 0
    if steps <= STEP_LIMIT:
        return ""
    return (
        f"train.epochs: {shown(t.epochs)} epochs of {images:,} images (data.train_per_class) in batches of "
        f"{t.batch_size} are {steps:,} steps per seed, more than {STEP_LIMIT:,}: even at "
        f"{STEPS_PER_SECOND:,} steps a second (beyond any this model has run) they would take "
        f"{steps / STEPS_PER_SECOND / 86400:,.0f} days"
    )


def variant_problems(raw: object) -> list[str]:
    """params.yaml's `variants:` section: DVC's matrix axes, not part of Config, but still checked."""
    if not isinstance(raw, dict):
        return [f"variants: expected a mapping, got {shown(raw)}"]
    found = [
        f"variants.{key}: unknown key (known: {', '.join(VARIANT_AXES)})"
        for key in raw
        if key not in VARIANT_AXES
    ]
    for axis, known in VARIANT_AXES.items():
        values, names = raw.get(axis, list(known)), ", ".join(known)
        if not isinstance(values, list) or not values:
            found.append(f"variants.{axis}: expected a non-empty list of {names}, got {shown(values)}")
            continue
        found += [f"variants.{axis}: unknown {shown(v)} (known: {names})" for v in values if v not in known]
        repeated = [v for v in dict.fromkeys(values) if values.count(v) > 1]
        found += [f"variants.{axis}: repeats {shown(v)}" for v in repeated]
    return found


def _get(cfg: Config, dotted: str) -> object:
    section, name = dotted.split(".")
    return getattr(getattr(cfg, section), name)
