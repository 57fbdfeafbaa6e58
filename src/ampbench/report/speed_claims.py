"""docs/FINDINGS.md's speed claims: 1 (autocast barely speeds training up) and 2 (GradScaler slows
training down). Speed-ups compare mean steady-state images/s over seeds; ms/step is the global
batch over images/s. Bench numbers (where a step's time goes) come from untracked runs.
"""

from __future__ import annotations

import math

from ampbench.report.claims import (
    AC,
    ALPHA,
    BARELY,
    CLAIMS,
    FP32,
    GS,
    PROJECT,
    TUTORIAL,
    cite,
    fmt_p,
    mean_std,
    seed_values,
    setting,
    verdict,
)
from ampbench.report.compare import _ms, _welch_p


def _speed(studies: dict, variant: str, base: str) -> dict[str, tuple[float, float]]:
    """{study: (speed-up of variant over base in mean images/s, Welch p on images/s)}."""
    out = {}
    for label, runs in studies.items():
        a, b = (
            seed_values(runs[f"single-{variant}"], "images_per_second"),
            seed_values(runs[f"single-{base}"], "images_per_second"),
        )
        out[label] = (_ms(a)[0] / _ms(b)[0], _welch_p(a, b))
    return out


def _speed_table(studies: dict, variants: tuple[str, ...]) -> list[str]:
    lines = [
        "| study | variant | images/s | train s | ms/step | setting | MLflow runs |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, runs in studies.items():
        for v in variants:
            rec = runs[f"single-{v}"]
            batch = rec["seeds"][0].get("train.batch_size")
            ips = _ms(seed_values(rec, "images_per_second"))[0]
            ms = f"{1e3 * batch / ips:.2f}" if batch and ips else "n/a"
            lines.append(
                f"| {label} | single-{v} | {mean_std(rec, 'images_per_second', 0)} "
                f"| {mean_std(rec, 'train_seconds', 1)} | {ms} | {setting(rec)} | {cite(rec)} |"
            )
    return lines


def _bench_rows(bench: dict | None) -> dict[tuple[str, str], dict]:
    rows = (bench or {}).get("rows", [])
    return {(r["measure"], r["variant"]): r for r in rows if r.get("compile", "none") == "none"}


def bench_source(bench: dict) -> str:
    """Where the bench figures come from: its MLflow run, or the file alone for an untracked bench."""
    run_id = bench.get("run_id")
    return f"bench run `{run_id}`" if run_id else "bench file, untracked: no MLflow run"


def _mean_ips(studies: dict, precision: str, label: str = TUTORIAL) -> float:
    return _ms(seed_values(studies[label][f"single-{precision}"], "images_per_second"))[0]


def _where_time_goes(studies: dict, bench: dict | None) -> str:
    rows = _bench_rows(bench)
    loader = next((r for (m, _), r in rows.items() if m.startswith("dataloader")), None)
    ceiling = rows.get(("ceiling", "single-autocast"))
    if loader and ceiling:
        fp32 = rows.get(("ceiling", "single-fp32"), {}).get("images_per_second", math.nan)
        return (
            f"Where the time goes (`ampbench bench`, {bench.get('hardware', '?')}, batch "
            f"{bench.get('batch', '?')}; {bench_source(bench)}): the tutorial's input pipeline, "
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
        f"- {label}: autocast / fp32 = **{s:.2f}x** in images/s (Welch p on images/s {fmt_p(p)})"
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
        f"Profile of the autocast_gradscaler step ({bench_source(bench)}): kernels named `non_finite` "
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
            f"- {label}: GradScaler's step costs {1 / r_ac:.3f}x autocast's (p {fmt_p(p_ac)}); "
            f"it trains at {r_fp:.2f}x fp32's images/s (p {fmt_p(p_fp)})"
        )
    rows = _bench_rows(bench)
    gs, ac = rows.get(("ceiling", "single-autocast_gradscaler")), rows.get(("ceiling", "single-autocast"))
    if gs and ac and "ms_per_step" in gs and "ms_per_step" in ac:
        lines += [
            "",
            f"Bench ceiling ({bench_source(bench)}): {gs['ms_per_step']:.3f} ms/step with GradScaler, "
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
