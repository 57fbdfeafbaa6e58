"""docs/FINDINGS.md's speed claims: 1 (autocast barely speeds training up) and 2 (GradScaler slows
training down). Speed-ups compare mean steady-state images/s over seeds; ms/step is the global
batch over images/s. Bench numbers (where a step's time goes) come from untracked runs.
"""

from __future__ import annotations

import math

from ampbench.report import selfcheck, stats
from ampbench.report.claims import (
    AC,
    BARELY,
    FP32,
    GS,
    PROJECT,
    TUTORIAL,
    cite,
    claim_head,
    fmt_p,
    mean_std,
    seed_values,
    setting,
    verdict,
)
from ampbench.report.sentences import ENGLISH, Words


def _speed(studies: dict, variant: str, base: str) -> dict[str, tuple[float, float]]:
    """{study: (speed-up of variant over base in mean images/s, Welch p on images/s)}."""
    out = {}
    for label, runs in studies.items():
        a, b = (
            seed_values(runs[f"single-{variant}"], "images_per_second"),
            seed_values(runs[f"single-{base}"], "images_per_second"),
        )
        out[label] = (stats.mean_std(a)[0] / stats.mean_std(b)[0], stats.welch_p(a, b))
    return out


def _under_barely(studies: dict, variant: str, base: str) -> dict[str, bool]:
    """{study: whether the speed-up of variant over base is shown to be under BARELY}: one-sided
    Welch, variant's images/s below BARELY times base's (hostile pass Z: 1.15x at p 0.81, two noisy
    seeds, was "holds")."""
    out = {}
    for label, runs in studies.items():
        a = seed_values(runs[f"single-{variant}"], "images_per_second")
        b = [BARELY * x for x in seed_values(runs[f"single-{base}"], "images_per_second")]
        out[label] = _significant(stats.welch_p(a, b, alternative="less"))
    return out


def _speed_table(studies: dict, variants: tuple[str, ...], w: Words) -> list[str]:
    lines = [w("speed.head"), "|---|---|---|---|---|---|---|"]
    for label, runs in studies.items():
        for v in variants:
            rec = runs[f"single-{v}"]
            batch = rec["seeds"][0].get("train.batch_size")
            ips = stats.mean_std(seed_values(rec, "images_per_second"))[0]
            ms = f"{1e3 * batch / ips:.2f}" if batch and ips else w("na")
            lines.append(
                f"| {w.name(label)} | single-{v} | {mean_std(rec, 'images_per_second', 0, w)} "
                f"| {mean_std(rec, 'train_seconds', 1, w)} | {ms} | {setting(rec, w)} | {cite(rec, w)} |"
            )
    noisy = [
        f"{w.name(label)} single-{v}: {verdict}"
        for label, runs in studies.items()
        for v in variants
        if (verdict := selfcheck.of_seeds(runs[f"single-{v}"]["seeds"]))
    ]
    return [*lines, "", w("speed.noisy", which=w.list(noisy, "; ")) if noisy else w("speed.steady")]


def _bench_rows(bench: dict | None) -> dict[tuple[str, str], dict]:
    rows = (bench or {}).get("rows", [])
    return {(r["measure"], r["variant"]): r for r in rows if r.get("compile", "none") == "none"}


def bench_source(bench: dict, w: Words = ENGLISH) -> str:
    """Where the bench figures come from: its MLflow run, or the file alone for an untracked bench."""
    run_id = bench.get("run_id")
    return w("bench.run", run_id=run_id) if run_id else w("bench.untracked")


def _mean_ips(studies: dict, precision: str, label: str = TUTORIAL) -> float:
    return stats.mean_std(seed_values(studies[label][f"single-{precision}"], "images_per_second"))[0]


def _where_time_goes(studies: dict, bench: dict | None, w: Words) -> str:
    rows = _bench_rows(bench)
    loader = next((r for (m, _), r in rows.items() if m.startswith("dataloader")), None)
    ceiling = rows.get(("ceiling", "single-autocast"))
    if bench and loader and ceiling:
        fp32 = rows.get(("ceiling", "single-fp32"), {}).get("images_per_second", math.nan)
        return w(
            "time.bench",
            hardware=bench.get("hardware", "?"),
            batch=bench.get("batch", "?"),
            source=bench_source(bench, w),
            loader=loader["measure"],
            loader_ips=f"{loader['images_per_second']:,.0f}",
            ceiling_ips=f"{ceiling['images_per_second']:,.0f}",
            fp32_ips=f"{fp32:,.0f}",
            run_ips=f"{_mean_ips(studies, 'autocast'):,.0f}",
            cite=cite(studies[TUTORIAL]["single-autocast"], w),
        )
    tut, proj = _mean_ips(studies, AC), _mean_ips(studies, AC, PROJECT)
    return w("time.nobench", tut=f"{tut:,.0f}", proj=f"{proj:,.0f}")


def claim1(studies: dict, bench: dict | None, w: Words = ENGLISH) -> str:
    speed = _speed(studies, AC, FP32)
    lines = [claim_head(1, w), "", w("c1.tutorial"), "", *_speed_table(studies, (FP32, AC), w), ""]
    lines += [
        w("c1.bullet", label=w.name(label), ratio=f"{s:.2f}", p=fmt_p(p, w))
        for label, (s, p) in speed.items()
    ]
    with_tf32 = {label: runs for label, runs in studies.items() if "single-tf32" in runs}
    lines += [  # AMP's gain against what PyTorch runs by default, where the study measured tf32
        w("c1.tf32", label=w.name(label), ratio=f"{s:.2f}", p=fmt_p(p, w))
        for label, (s, p) in _speed(with_tf32, AC, "tf32").items()
    ]
    lines += ["", _where_time_goes(studies, bench, w), ""]
    tut, proj = f"{speed[TUTORIAL][0]:.2f}", f"{speed[PROJECT][0]:.2f}"
    rule = w("c1.rule", barely=BARELY)
    # more than barely only where the speed-up is also no noise (hostile pass V: 1.43x at p 0.08, two
    # noisy seeds, was "does not hold")
    shown = {label: s >= BARELY and _significant(p) for label, (s, p) in speed.items()}
    barely = _under_barely(studies, AC, FP32)  # and "barely" only where that is no noise either
    if barely[TUTORIAL] and barely[PROJECT]:
        v = verdict(1, "holds", w("c1.both", tut=tut, proj=proj, rule=rule), w)
    elif barely[TUTORIAL] and shown[PROJECT]:
        reason = w("c1.tutorial_only", tut=tut, proj=proj, rule=rule)
        v = verdict(1, "holds only under the tutorial's conditions", reason, w)
    elif all(shown.values()):
        v = verdict(1, "does not hold", w("c1.neither", tut=tut, proj=proj, rule=rule), w)
    else:
        v = verdict(1, "not shown either way", w("c1.unclear", tut=tut, proj=proj, rule=rule), w)
    return "\n".join([*lines, v])


def _significant(p: float) -> bool:
    return not math.isnan(p) and p < stats.ALPHA


def _scaler_profile(bench: dict | None, w: Words) -> str:
    prof = (bench or {}).get("profiles", {}).get("single-autocast_gradscaler")
    if not bench or not prof:
        return w("c2.noprofile")
    hits = [k for k in prof.get("kernels", []) if "non_finite" in k.get("kernel", "")]
    us = sum(k["us_per_step"] for k in hits)
    of = w("c2.profile_of", ms=f"{prof['ms_per_step']:.3f}") if "ms_per_step" in prof else ""
    return w("c2.profile", source=bench_source(bench, w), us=f"{us:.1f}", of=of)


def claim2(studies: dict, bench: dict | None, w: Words = ENGLISH) -> str:
    vs_ac, vs_fp32 = _speed(studies, GS, AC), _speed(studies, GS, FP32)
    lines = [claim_head(2, w), "", w("c2.tutorial"), "", *_speed_table(studies, (FP32, AC, GS), w), ""]
    for label in studies:
        (r_ac, p_ac), (r_fp, p_fp) = vs_ac[label], vs_fp32[label]
        lines.append(
            w(
                "c2.bullet",
                label=w.name(label),
                cost=f"{1 / r_ac:.3f}",
                p_ac=fmt_p(p_ac, w),
                ratio=f"{r_fp:.2f}",
                p_fp=fmt_p(p_fp, w),
            )
        )
    rows = _bench_rows(bench)
    gs, ac = rows.get(("ceiling", "single-autocast_gradscaler")), rows.get(("ceiling", "single-autocast"))
    if bench and gs and ac and "ms_per_step" in gs and "ms_per_step" in ac:
        g, a = gs["ms_per_step"], ac["ms_per_step"]
        source = bench_source(bench, w)
        lines += ["", w("c2.ceiling", source=source, gs=f"{g:.3f}", ac=f"{a:.3f}", diff=f"{g - a:.3f}")]
    lines += ["", w("c2.why", profile=_scaler_profile(bench, w)), ""]
    slower = {label: r < 1 and _significant(p) for label, (r, p) in vs_fp32.items()}
    faster = {label: r >= 1 and _significant(p) for label, (r, p) in vs_fp32.items()}
    why = w.list(w("c2.why_item", ratio=f"{vs_fp32[label][0]:.2f}", label=w.name(label)) for label in studies)
    if slower[TUTORIAL] and slower[PROJECT]:
        v = verdict(2, "holds", w("c2.both", why=why), w)
    elif slower[TUTORIAL]:
        v = verdict(2, "holds only under the tutorial's conditions", w("c2.tutorial_only", why=why), w)
    elif all(faster.values()):  # never slower, and no noise (hostile passes T, V: within it, "does not hold")
        v = verdict(2, "does not hold", w("c2.neither", why=why), w)
    else:
        v = verdict(2, "not shown either way", w("c2.unclear", why=why), w)
    return "\n".join([*lines, v])
