"""docs/FINDINGS.md's shared pieces (citations, settings, verdicts) and its claim 3 and 4 sections.

The speed claims (1, 2) are in speed_claims.py. Each section takes ``studies`` ({label: {variant:
metrics file}}, the tutorial's conditions first) and returns markdown ending in one verdict line.
Thresholds are named here, so a verdict can be traced to a rule: "barely" is a speed-up under
BARELY; a difference is real at p < stats.ALPHA.
"""

from __future__ import annotations

import math

from ampbench.report import stats
from ampbench.report.equivalence import tost
from ampbench.report.sentences import ENGLISH, Words

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


def mean_std(rec: dict, key: str, digits: int, w: Words = ENGLISH) -> str:
    mean, std = stats.mean_std(seed_values(rec, key))
    return w("na") if math.isnan(mean) else f"{mean:,.{digits}f} ± {std:,.{digits}f}"


def cite(rec: dict, w: Words = ENGLISH) -> str:
    """The MLflow runs behind a variant's numbers: its variant run, then its seed runs."""
    variant = sorted({s["variant_run_id"] for s in rec["seeds"] if s.get("variant_run_id")})
    seeds = [s["run_id"] for s in rec["seeds"] if s.get("run_id")]
    return w(
        "cite",
        variant=w.list(f"`{r}`" for r in variant) or "?",
        seeds=w.list(f"`{r}`" for r in seeds),
    )


def setting(rec: dict, w: Words = ENGLISH) -> str:
    """Hardware, batch, input pipeline, execution and precision of a variant's first seed."""
    s = rec["seeds"][0]
    loader = s.get("train.loader") or "?"
    if loader == "device":
        loader = w("loader.device")
    if loader == "dataloader":
        loader = w("loader.workers", loader=loader, workers=s.get("train.workers"))
    return w(
        "setting",
        device=s.get("device_name", "?"),
        batch=s.get("train.batch_size", "?"),
        loader=loader,
        graph=w("graph.yes" if s.get("cuda_graph_used") else "graph.no"),
        dtype=s.get("amp_dtype", "?"),
        seeds=len(rec["seeds"]),
        epochs=s.get("epochs_completed", "?"),
    )


def fmt_p(p: float, w: Words = ENGLISH) -> str:
    return w("p.na") if math.isnan(p) else f"{p:.3g}"


def verdict(n: int, what: str, reason: str, w: Words = ENGLISH) -> str:
    assert what in VERDICTS, what
    return w("verdict", n=n, what=w.name(what), reason=reason)


def claim_head(n: int, w: Words) -> str:
    return w("claim.head", n=n, claim=w.name(CLAIMS[n]))


def conditions_table(studies: dict, w: Words = ENGLISH) -> str:
    lines = [w("conditions.head"), "|---|---|---|"]
    lines += [
        f"| {w.name(label)} | {setting(runs['single-fp32'], w)} | {cite(runs['single-fp32'], w)} |"
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
            delta = stats.mean_std(a)[0] - stats.mean_std(b)[0]
            out.append((label, variant, delta, stats.welch_p(a, b), rec, base))
    return out


def claim3(studies: dict, margin_pts: float = 0.5, w: Words = ENGLISH) -> str:
    rows = _accuracy_rows(studies)
    margin = f"{margin_pts:g}"
    lines = [claim_head(3, w), "", w("c3.tutorial"), "", w("c3.head", margin=margin)]
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    equivalence = {}
    for label, variant, delta, p, rec, base in rows:
        acc, base_acc = mean_std(rec, "test_accuracy", 4, w), mean_std(base, "test_accuracy", 4, w)
        t = tost(seed_values(rec, "test_accuracy"), seed_values(base, "test_accuracy"), margin_pts / 100)
        equivalence[(label, variant)] = t
        ci = w("na") if t is None else w("c3.ci", low=f"{t.low * 100:+.2f}", high=f"{t.high * 100:+.2f}")
        runs = w("c3.fp32_runs", cite=cite(rec, w), base=cite(base, w))
        lines.append(
            f"| {w.name(label)} | {variant} | {acc} | {base_acc} | {delta:+.4f} | {fmt_p(p, w)} | {ci} "
            f"| {w('na') if t is None else fmt_p(t.p, w)} | {setting(rec, w)} | {runs} |"
        )
    stds = [
        stats.mean_std(seed_values(runs[f"single-{FP32}"], "test_accuracy"))[1] for runs in studies.values()
    ]
    studies_said = w.list(w.name(label) for label in studies)
    note = w("c3.note", stds=w.list(f"{s:.4f}" for s in stds), studies=studies_said, margin=margin)
    lines += ["", note, ""]
    return "\n".join([*lines, _claim3_verdict(rows, equivalence, margin, w)])


def _claim3_verdict(rows: list, equivalence: dict, margin: str, w: Words) -> str:
    tested = [r for r in rows if not math.isnan(r[3])]
    real = sorted({r[0] for r in tested if r[3] < stats.ALPHA})
    names = w.list(
        w("c3.name", variant=r[1], label=w.name(r[0]), p=fmt_p(r[3], w)) for r in tested if r[3] < stats.ALPHA
    )
    if not tested:
        return verdict(3, "not tested here", w("c3.untested"), w)
    if real == [TUTORIAL]:
        return verdict(3, "holds only under the tutorial's conditions", w("c3.tutorial_only", names=names), w)
    if real:
        return verdict(3, "holds", w("c3.holds", names=names), w)
    open_ = [(k, t) for k, t in equivalence.items() if t is None or not t.equivalent]
    if not open_:
        reason = w("c3.equivalent", margin=margin, n=len(equivalence), alpha=stats.ALPHA)
        return verdict(3, "does not hold", reason, w)
    which = w.list(
        w(
            "c3.open_item",
            variant=variant,
            label=w.name(label),
            ci="" if t is None else w("c3.open_ci", low=f"{t.low * 100:+.2f}", high=f"{t.high * 100:+.2f}"),
        )
        for (label, variant), t in open_
    )
    reason = w("c3.open", n=len(tested), alpha=stats.ALPHA, margin=margin, which=which)
    return verdict(3, "not shown either way", reason, w)


def claim4(studies: dict, w: Words = ENGLISH) -> str:
    lines = [claim_head(4, w), "", w("c4.mechanism"), ""]
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
            w(
                "c4.bullet",
                label=w.name(label),
                variant=variant,
                place=place,
                dtypes=s["replica_dtypes"],
                setting=setting(rec, w),
                cite=cite(rec, w),
            )
        )
        if variant.startswith("dp-") and (s.get("devices_used") or 1) >= 2 and place == "outside_forward":
            multi.append(s["replica_dtypes"])
    lines += ["", w("c4.demo"), ""]
    if not multi:
        v = verdict(4, "not tested here", w("c4.untested"), w)
    elif any("float32" in m for m in multi):
        v = verdict(4, "holds", w("c4.holds", dtypes=w.list(multi, "; ")), w)
    else:
        v = verdict(4, "does not hold", w("c4.not", dtypes=w.list(multi, "; ")), w)
    return "\n".join([*lines, v])
