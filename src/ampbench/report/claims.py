"""docs/FINDINGS.md's shared pieces (citations, settings, verdicts) and its claim 3 and 4 sections.

The speed claims (1, 2) are in speed_claims.py. Each section takes ``studies`` ({label: {variant:
metrics file}}, the tutorial's conditions first) and returns markdown ending in one verdict line.
Thresholds are named here, so a verdict can be traced to a rule: "barely" is a speed-up under
BARELY; a difference is real at p < compare.ALPHA.
"""

from __future__ import annotations

import math

from ampbench.report.compare import ALPHA, _ms, _welch_p
from ampbench.report.equivalence import tost

TUTORIAL, PROJECT = "tutorial's conditions", "project's defaults"
VERDICTS = (
    "holds",
    "does not hold",
    "holds only under the tutorial's conditions",
    "not shown either way",
    "not tested here",
)
CLAIMS = {
    1: "autocast barely speeds training up",
    2: "GradScaler slows training down, below no AMP at all",
    3: "AMP changes accuracy",
    4: "DataParallel needs autocast inside forward, or the replicas run in fp32",
}
BARELY = 1.2  # a speed-up below this counts as "barely" (the tutorial's was 1.05x)
FP32, AC, GS = "fp32", "autocast", "autocast_gradscaler"


def seed_values(rec: dict, key: str) -> list[float]:
    return [float(s[key]) for s in rec["seeds"] if s.get(key) is not None]


def mean_std(rec: dict, key: str, digits: int) -> str:
    mean, std = _ms(seed_values(rec, key))
    return "n/a" if math.isnan(mean) else f"{mean:,.{digits}f} ± {std:,.{digits}f}"


def cite(rec: dict) -> str:
    """The MLflow runs behind a variant's numbers: its variant run, then its seed runs."""
    variant = sorted({s["variant_run_id"] for s in rec["seeds"] if s.get("variant_run_id")})
    seeds = [s["run_id"] for s in rec["seeds"] if s.get("run_id")]
    return f"variant run {', '.join(f'`{r}`' for r in variant) or '?'}; seed runs " + ", ".join(
        f"`{r}`" for r in seeds
    )


def setting(rec: dict) -> str:
    """Hardware, batch, input pipeline, execution and precision of a variant's first seed."""
    s = rec["seeds"][0]
    loader = s.get("train.loader") or "?"
    if loader == "device":
        loader = "data on the device"
    if loader == "dataloader":
        loader += f" ({s.get('train.workers')} workers)"
    graph = "CUDA graph" if s.get("cuda_graph_used") else "eager"
    return (
        f"{s.get('device_name', '?')}, batch {s.get('train.batch_size', '?')}, {loader}, {graph}, "
        f"{s.get('amp_dtype', '?')}, {len(rec['seeds'])} seed(s), {s.get('epochs_completed', '?')} epochs"
    )


def fmt_p(p: float) -> str:
    return "n/a (< 2 seeds)" if math.isnan(p) else f"{p:.3g}"


def verdict(n: int, what: str, reason: str) -> str:
    assert what in VERDICTS, what
    return f"**Verdict (claim {n}): {what}** — {reason}"


def conditions_table(studies: dict) -> str:
    lines = ["| study | setting (single-fp32's first seed) | MLflow runs of single-fp32 |", "|---|---|---|"]
    lines += [
        f"| {label} | {setting(runs['single-fp32'])} | {cite(runs['single-fp32'])} |"
        for label, runs in studies.items()
    ]
    return "\n".join(lines)


def _accuracy_rows(studies: dict) -> list[tuple[str, str, float, float, dict, dict]]:
    """(study, variant, delta vs its parallel mode's fp32, Welch p, record, baseline record)."""
    out = []
    for label, runs in studies.items():
        for variant, rec in sorted(runs.items()):
            parallel_name, _, prec = variant.partition("-")
            base = runs.get(f"{parallel_name}-{FP32}")
            if prec == FP32 or base is None:
                continue
            a, b = seed_values(rec, "test_accuracy"), seed_values(base, "test_accuracy")
            out.append((label, variant, _ms(a)[0] - _ms(b)[0], _welch_p(a, b), rec, base))
    return out


def claim3(studies: dict, margin_pts: float = 0.5) -> str:
    rows = _accuracy_rows(studies)
    lines = [
        f"## Claim 3: {CLAIMS[3]}",
        "",
        "The tutorial (one run each): single 0.8191 -> 0.8403 with autocast, DP 0.8216 -> 0.8188, DDP "
        '0.8224 -> 0.8162; with GradScaler "raised again" to 0.8409 / 0.8252.',
        "",
        f"| study | variant | test accuracy | fp32 of its mode | Δ | p (Welch) | Δ's 90% CI (points) "
        f"| TOST p (±{margin_pts:g} points) | setting | MLflow runs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    equivalence = {}
    for label, variant, delta, p, rec, base in rows:
        acc, base_acc = mean_std(rec, "test_accuracy", 4), mean_std(base, "test_accuracy", 4)
        t = tost(seed_values(rec, "test_accuracy"), seed_values(base, "test_accuracy"), margin_pts / 100)
        equivalence[(label, variant)] = t
        ci = "n/a" if t is None else f"{t.low * 100:+.2f} to {t.high * 100:+.2f}"
        lines.append(
            f"| {label} | {variant} | {acc} | {base_acc} | {delta:+.4f} | {fmt_p(p)} | {ci} "
            f"| {'n/a' if t is None else fmt_p(t.p)} | {setting(rec)} | {cite(rec)}; fp32: {cite(base)} |"
        )
    stds = [_ms(seed_values(runs[f"single-{FP32}"], "test_accuracy"))[1] for runs in studies.values()]
    lines += [
        "",
        f"Seed-to-seed std of single-fp32: {', '.join(f'{s:.4f}' for s in stds)} ({', '.join(studies)}); "
        "the tutorial's differences (+0.0212, -0.0028, -0.0062) come from one run per setting. "
        f"Equivalence: two one-sided Welch tests (TOST) against ±{margin_pts:g} accuracy points "
        "(`report.equivalence_margin_pts`); equivalent when the 90% CI lies inside the margin.",
        "",
    ]
    return "\n".join([*lines, _claim3_verdict(rows, equivalence, margin_pts)])


def _claim3_verdict(rows: list, equivalence: dict, margin_pts: float) -> str:
    tested = [r for r in rows if not math.isnan(r[3])]
    real = sorted({r[0] for r in tested if r[3] < ALPHA})
    names = ", ".join(f"{r[1]} ({r[0]}, p {fmt_p(r[3])})" for r in tested if r[3] < ALPHA)
    if not tested:
        return verdict(3, "not tested here", "fewer than 2 seeds per variant: no significance test possible")
    if real == [TUTORIAL]:
        return verdict(3, "holds only under the tutorial's conditions", f"significant: {names}")
    if real:
        return verdict(3, "holds", f"significant differences from fp32: {names}")
    open_ = [(k, t) for k, t in equivalence.items() if t is None or not t.equivalent]
    if not open_:
        return verdict(
            3,
            "does not hold",
            f"every AMP variant's accuracy is equivalent to fp32's within ±{margin_pts:g} points "
            f"({len(equivalence)} TOSTs, all p < {ALPHA}); no difference exceeds seed noise",
        )
    which = ", ".join(
        f"{variant} ({label}"
        + ("" if t is None else f", 90% CI {t.low * 100:+.2f} to {t.high * 100:+.2f}")
        + ")"
        for (label, variant), t in open_
    )
    return verdict(
        3,
        "not shown either way",
        f"no difference from fp32 exceeds seed noise ({len(tested)} Welch tests, all p >= {ALPHA}), but "
        f"equivalence within ±{margin_pts:g} points is not shown for {which}: more seeds would decide",
    )


def claim4(studies: dict) -> str:
    lines = [
        f"## Claim 4: {CLAIMS[4]}",
        "",
        "Mechanism (torch 2.14, `torch/nn/parallel/parallel_apply.py`): autocast state is thread-local, "
        "and DataParallel runs each replica in a thread of its own, which re-enters autocast as "
        "`torch.amp.autocast(device_type, enabled=torch.is_autocast_enabled())`: the outer autocast's "
        "*enabled* flag crosses into the replicas, its dtype does not. A fresh thread has the device's "
        "default autocast dtype, float16 on CUDA. So with autocast outside `forward` the replicas run "
        "float16, not fp32, under an outer float16 autocast (the tutorial's dtype) and also under an "
        "outer bfloat16 one. The project enters autocast inside `forward` (model.py), so each replica "
        "runs the configured dtype; `replica_dtypes` records what each replica's first convolution "
        "produced.",
        "",
    ]
    rows = [
        (label, v, rec)
        for label, runs in studies.items()
        for v, rec in sorted(runs.items())
        if rec["seeds"][0].get("replica_dtypes") and not v.endswith(FP32)
    ]
    multi = []
    for label, variant, rec in rows:
        s = rec["seeds"][0]
        place = s.get("autocast_placement") or "in_forward"
        lines.append(
            f"- {label}, {variant}: placement {place}, replicas ran `{s['replica_dtypes']}` "
            f"({setting(rec)}; {cite(rec)})"
        )
        if variant.startswith("dp-") and (s.get("devices_used") or 1) >= 2 and place == "outside_forward":
            multi.append(s["replica_dtypes"])
    lines += [
        "",
        "The demonstration: `train.dp_autocast_outside_forward: true` (a param for this claim only) "
        "moves autocast out of `forward`; `pytest -m gpu tests/training/test_autocast_placement.py` "
        "asserts on two or more GPUs what each replica ran. On one GPU DataParallel calls the module "
        "directly, so nothing can be shown there.",
        "",
    ]
    if not multi:
        v = verdict(
            4,
            "not tested here",
            "no dp run with autocast outside forward on 2+ GPUs yet (the "
            "multi-GPU run is pending); torch 2.14's source says the replicas run float16, not fp32",
        )
    elif any("float32" in m for m in multi):
        v = verdict(4, "holds", f"replicas ran {'; '.join(multi)}")
    else:
        v = verdict(
            4,
            "does not hold",
            f"with autocast outside forward the replicas ran {'; '.join(multi)}, not float32",
        )
    return "\n".join([*lines, v])
