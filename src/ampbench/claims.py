"""The four sections of docs/FINDINGS.md (see findings.py): one function per tutorial claim.

Each takes ``studies`` ({label: {variant: metrics file}}, the tutorial's conditions first) and
returns markdown ending in one verdict line. Thresholds are named here, so a verdict can be
traced to a rule: "barely" is a speed-up under BARELY; a difference is real at p < compare.ALPHA.
"""

from __future__ import annotations

import math

from ampbench.compare import ALPHA, _ms, _welch_p

TUTORIAL, PROJECT = "tutorial's conditions", "project's defaults"
VERDICTS = ("holds", "does not hold", "holds only under the tutorial's conditions", "not tested here")
CLAIMS = {
    1: "autocast barely speeds training up",
    2: "GradScaler slows training down, below no AMP at all",
    3: "AMP changes accuracy",
    4: "DataParallel needs autocast inside forward, or the replicas run in fp32",
}
BARELY = 1.2  # a speed-up below this counts as "barely" (the tutorial's was 1.05x)
FP32, AC, GS = "fp32", "autocast", "autocast_gradscaler"


def _values(rec: dict, key: str) -> list[float]:
    return [float(s[key]) for s in rec["seeds"] if s.get(key) is not None]


def _pm(rec: dict, key: str, digits: int) -> str:
    mean, std = _ms(_values(rec, key))
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


def _p(p: float) -> str:
    return "n/a (< 2 seeds)" if math.isnan(p) else f"{p:.3g}"


def _speed(studies: dict, variant: str, base: str) -> dict[str, tuple[float, float]]:
    """{study: (speed-up of variant over base in mean images/s, Welch p on images/s)}."""
    out = {}
    for label, runs in studies.items():
        a, b = (
            _values(runs[f"single-{variant}"], "images_per_second"),
            _values(runs[f"single-{base}"], "images_per_second"),
        )
        out[label] = (_ms(a)[0] / _ms(b)[0], _welch_p(a, b))
    return out


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


def _speed_table(studies: dict, variants: tuple[str, ...]) -> list[str]:
    lines = [
        "| study | variant | images/s | train s | ms/step | setting | MLflow runs |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, runs in studies.items():
        for v in variants:
            rec = runs[f"single-{v}"]
            batch = rec["seeds"][0].get("train.batch_size")
            ips = _ms(_values(rec, "images_per_second"))[0]
            ms = f"{1e3 * batch / ips:.2f}" if batch and ips else "n/a"
            lines.append(
                f"| {label} | single-{v} | {_pm(rec, 'images_per_second', 0)} "
                f"| {_pm(rec, 'train_seconds', 1)} | {ms} | {setting(rec)} | {cite(rec)} |"
            )
    return lines


def _bench_rows(bench: dict | None) -> dict[tuple[str, str], dict]:
    return {(r["measure"], r["variant"]): r for r in (bench or {}).get("rows", [])}


def _mean_ips(studies: dict, precision: str, label: str = TUTORIAL) -> float:
    return _ms(_values(studies[label][f"single-{precision}"], "images_per_second"))[0]


def _where_time_goes(studies: dict, bench: dict | None) -> str:
    rows = _bench_rows(bench)
    loader = next((r for (m, _), r in rows.items() if m.startswith("dataloader")), None)
    ceiling = rows.get(("ceiling", "single-autocast"))
    if loader and ceiling:
        fp32 = rows.get(("ceiling", "single-fp32"), {}).get("images_per_second", math.nan)
        return (
            f"Where the time goes (`ampbench bench`, {bench.get('hardware', '?')}, batch "
            f"{bench.get('batch', '?')}; untracked, no MLflow run): the tutorial's input pipeline, "
            f"{loader['measure']}, feeds {loader['images_per_second']:,.0f} images/s; the bare autocast "
            f"step (ceiling) runs {ceiling['images_per_second']:,.0f} images/s and fp32 {fp32:,.0f}. "
            "Fed by that DataLoader, a step can go no faster than it delivers, whatever its precision: "
            f"the tutorial-conditions autocast run trained {_mean_ips(studies, 'autocast'):,.0f} images/s "
            f"({cite(studies[TUTORIAL]['single-autocast'])})."
        )
    tut, proj = _mean_ips(studies, AC), _mean_ips(studies, AC, PROJECT)
    return (
        f"Where the time goes (no bench JSON given): the same autocast step trains {tut:,.0f} images/s "
        f"under the tutorial's conditions and {proj:,.0f} under the project's; the difference is the "
        "input pipeline, the batch and eager launches. `ampbench bench --batch-size 128` splits them."
    )


def claim1(studies: dict, bench: dict | None) -> str:
    speed = _speed(studies, AC, FP32)
    lines = [
        f"## Claim 1: {CLAIMS[1]}",
        "",
        "The tutorial: 20 epochs took 22 min 22 s in fp32 and 21 min 21 s with autocast (1.05x), one "
        "hand-timed run each.",
        "",
        *_speed_table(studies, (FP32, AC)),
        "",
    ]
    lines += [
        f"- {label}: autocast / fp32 = **{s:.2f}x** in images/s (Welch p on images/s {_p(p)})"
        for label, (s, p) in speed.items()
    ]
    lines += ["", _where_time_goes(studies, bench), ""]
    tut, proj = speed[TUTORIAL][0], speed[PROJECT][0]
    rule = f"a speed-up under {BARELY}x counts as barely"
    if tut < BARELY and proj < BARELY:
        v = verdict(1, "holds", f"{tut:.2f}x and {proj:.2f}x under both conditions ({rule})")
    elif tut < BARELY:
        v = verdict(
            1,
            "holds only under the tutorial's conditions",
            f"{tut:.2f}x there, {proj:.2f}x under the project's defaults ({rule})",
        )
    else:
        v = verdict(
            1,
            "does not hold",
            f"{tut:.2f}x under the tutorial's conditions, {proj:.2f}x under the project's ({rule})",
        )
    return "\n".join([*lines, v])


def _scaler_profile(bench: dict | None) -> str:
    prof = (bench or {}).get("profiles", {}).get("single-autocast_gradscaler")
    if not prof:
        return "No kernel profile given (`ampbench bench --profile 20`)."
    hits = [k for k in prof.get("kernels", []) if "non_finite" in k.get("kernel", "")]
    us = sum(k["us_per_step"] for k in hits)
    return (
        f"Profile of the autocast_gradscaler step (bench, untracked): kernels named `non_finite` "
        f"(the scaler's check-and-unscale pass over the fp32 gradients) take {us:.1f} µs per step"
        + (f" of {prof['ms_per_step']:.3f} ms" if "ms_per_step" in prof else "")
        + "."
    )


def claim2(studies: dict, bench: dict | None) -> str:
    vs_ac, vs_fp32 = _speed(studies, GS, AC), _speed(studies, GS, FP32)
    lines = [
        f"## Claim 2: {CLAIMS[2]}",
        "",
        "The tutorial: 27 min 27 s for 20 epochs with GradScaler, against 22 min 22 s in fp32 and 21 min "
        "21 s with autocast alone, one hand-timed run each.",
        "",
        *_speed_table(studies, (FP32, AC, GS)),
        "",
    ]
    for label in studies:
        (r_ac, p_ac), (r_fp, p_fp) = vs_ac[label], vs_fp32[label]
        lines.append(
            f"- {label}: GradScaler's step costs {1 / r_ac:.3f}x autocast's (p {_p(p_ac)}); "
            f"it trains at {r_fp:.2f}x fp32's images/s (p {_p(p_fp)})"
        )
    rows = _bench_rows(bench)
    gs, ac = rows.get(("ceiling", "single-autocast_gradscaler")), rows.get(("ceiling", "single-autocast"))
    if gs and ac and "ms_per_step" in gs and "ms_per_step" in ac:
        lines += [
            "",
            f"Bench ceiling (untracked): {gs['ms_per_step']:.3f} ms/step with GradScaler, "
            f"{ac['ms_per_step']:.3f} without: +{gs['ms_per_step'] - ac['ms_per_step']:.3f} ms.",
        ]
    lines += [
        "",
        "Why it costs anything: the scaler multiplies the loss, then makes one extra pass over the fp32 "
        "gradients (check for inf/NaN and unscale; `_amp_foreach_non_finite_check_and_unscale_`) and "
        "updates its scale: a fixed cost per step, small next to a compute-bound step. "
        + _scaler_profile(bench),
        "",
    ]
    slower = {label: r < 1 and not math.isnan(p) and p < ALPHA for label, (r, p) in vs_fp32.items()}
    why = ", ".join(f"{vs_fp32[label][0]:.2f}x fp32 under the {label}" for label in studies)
    if slower[TUTORIAL] and slower[PROJECT]:
        v = verdict(2, "holds", f"GradScaler trains significantly slower than fp32 under both: {why}")
    elif slower[TUTORIAL]:
        v = verdict(2, "holds only under the tutorial's conditions", why)
    else:
        v = verdict(2, "does not hold", f"never significantly slower than fp32: {why}")
    return "\n".join([*lines, v])


def _accuracy_rows(studies: dict) -> list[tuple[str, str, float, float, dict, dict]]:
    """(study, variant, delta vs its parallel mode's fp32, Welch p, record, baseline record)."""
    out = []
    for label, runs in studies.items():
        for variant, rec in sorted(runs.items()):
            parallel_name, _, prec = variant.partition("-")
            base = runs.get(f"{parallel_name}-{FP32}")
            if prec == FP32 or base is None:
                continue
            a, b = _values(rec, "test_accuracy"), _values(base, "test_accuracy")
            out.append((label, variant, _ms(a)[0] - _ms(b)[0], _welch_p(a, b), rec, base))
    return out


def claim3(studies: dict) -> str:
    rows = _accuracy_rows(studies)
    lines = [
        f"## Claim 3: {CLAIMS[3]}",
        "",
        "The tutorial (one run each): single 0.8191 -> 0.8403 with autocast, DP 0.8216 -> 0.8188, DDP "
        '0.8224 -> 0.8162; with GradScaler "raised again" to 0.8409 / 0.8252.',
        "",
        "| study | variant | test accuracy | fp32 of its mode | Δ | p (Welch) | setting | MLflow runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, variant, delta, p, rec, base in rows:
        lines.append(
            f"| {label} | {variant} | {_pm(rec, 'test_accuracy', 4)} | {_pm(base, 'test_accuracy', 4)} "
            f"| {delta:+.4f} | {_p(p)} | {setting(rec)} | {cite(rec)}; fp32: {cite(base)} |"
        )
    stds = [_ms(_values(runs[f"single-{FP32}"], "test_accuracy"))[1] for runs in studies.values()]
    lines += [
        "",
        f"Seed-to-seed std of single-fp32: {', '.join(f'{s:.4f}' for s in stds)} ({', '.join(studies)}); "
        "the tutorial's differences (+0.0212, -0.0028, -0.0062) come from one run per setting.",
        "",
    ]
    tested = [r for r in rows if not math.isnan(r[3])]
    real = sorted({r[0] for r in tested if r[3] < ALPHA})
    names = ", ".join(f"{r[1]} ({r[0]}, p {_p(r[3])})" for r in tested if r[3] < ALPHA)
    if not tested:
        v = verdict(3, "not tested here", "fewer than 2 seeds per variant: no significance test possible")
    elif real == [TUTORIAL]:
        v = verdict(3, "holds only under the tutorial's conditions", f"significant: {names}")
    elif real:
        v = verdict(3, "holds", f"significant differences from fp32: {names}")
    else:
        v = verdict(
            3,
            "does not hold",
            f"no difference from fp32 exceeds seed noise ({len(tested)} Welch tests, all p >= {ALPHA})",
        )
    return "\n".join([*lines, v])


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
        "moves autocast out of `forward`; `pytest -m gpu tests/test_autocast_placement.py` asserts on "
        "two or more GPUs what each replica ran. On one GPU DataParallel calls the module directly, "
        "so nothing can be shown there.",
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
