"""docs/FINDINGS.md's "why" (issue #24): claims 1 and 2 explained rung by rung from `ampbench
explain`'s JSON (reports/explain.json): the overhead ladder from the tutorial's conditions to the
project's defaults, where AMP's speed-up comes from, and the batch at which it pays.

Every speed-up here is explain's own: a ratio of medians measured in the same run.
"""

from __future__ import annotations

import json
from pathlib import Path

from ampbench.report.claims import BARELY
from ampbench.report.sentences import ENGLISH, Words

WAITING = 0.5  # device busy less than this share of the wall time: the step mostly waits for the host


class LadderError(FileNotFoundError):
    """explain's JSON is missing or not one; the message says how to make it."""


def load(path: Path | None) -> dict | None:
    """explain's JSON, or None when not given."""
    if path is None:
        return None
    try:
        res = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise LadderError(
            f"--explain {path}: not readable as explain's JSON ({err}); make it with `make explain` "
            "(`ampbench explain`) on the GPU, or leave --explain out"
        ) from None
    if not res.get("rungs") or not all(_cell(r, "fp32") and _cell(r, "autocast") for r in res["rungs"]):
        raise LadderError(f"--explain {path}: no rungs with fp32 and autocast cells; re-run `make explain`")
    return res


def _cell(rung: dict, precision: str) -> dict | None:
    return next((c for c in rung.get("cells", []) if c.get("precision") == precision), None)


def _ratio(rung: dict, precision: str) -> float:
    return _cell(rung, precision)["images_per_second"] / _cell(rung, "fp32")["images_per_second"]


def section(res: dict | None, w: Words = ENGLISH) -> str:
    lines = [w("why.head"), ""]
    if res is None:
        return "\n".join([*lines, w("why.none")])
    rungs, o = res["rungs"], res.get("options", {})
    # the defaults' rung as explain named it; none on a CPU (R0-R2 only) or in an older JSON
    defaults = next((r for r in rungs if r["rung"] == res.get("defaults_rung")), None)
    source = w("explain.run", run_id=res["run_id"]) if res.get("run_id") else w("explain.untracked")
    lines += [
        w(
            "why.intro",
            hardware=res.get("hardware", "?"),
            source=source,
            windows=o.get("windows", "?"),
            steps=o.get("steps", "?"),
            defaults="" if defaults is None else w("why.defaults_id", rung=defaults["rung"]),
        ),
        "",
    ]
    if res.get("device_type") == "cpu":
        lines += [w("why.cpu"), ""]
    lines += [w("why.table"), "|---" * 10 + "|", *[_row(r, w) for r in rungs], ""]
    return "\n".join(lines + _reading(res, rungs, defaults, w))


def _row(rung: dict, w: Words) -> str:
    fp, ac = _cell(rung, "fp32"), _cell(rung, "autocast")
    gs = (
        w("na")
        if _cell(rung, "autocast_gradscaler") is None
        else f"{_ratio(rung, 'autocast_gradscaler'):.2f}x"
    )
    change = w.name(rung["change"])
    return (
        f"| {rung['rung']} | {change} | {rung['batch']} | {fp['images_per_second']:,.0f} "
        f"| {ac['images_per_second']:,.0f} | {_ratio(rung, 'autocast'):.2f}x | {gs} "
        f"| {fp['device_busy']:.0%} / {ac['device_busy']:.0%} | {ac['host_syncs_per_step']:.1f} "
        f"| {fp['peak_memory_mb']:,.0f} / {ac['peak_memory_mb']:,.0f} |"
    )


def _reading(res: dict, rungs: list[dict], defaults: dict | None, w: Words) -> list[str]:
    """What the table says, in sentences: R0, the biggest step, the defaults, GradScaler, batch."""
    r0, ac0 = rungs[0], _cell(rungs[0], "autocast")
    out = [
        w(
            "why.r0",
            rung=r0["rung"],
            busy32=f"{_cell(r0, 'fp32')['device_busy']:.0%}",
            busyac=f"{ac0['device_busy']:.0%}",
            ratio=f"{_ratio(r0, 'autocast'):.2f}",
        )
    ]
    if ac0["device_busy"] < WAITING and _ratio(r0, "autocast") < BARELY:
        out.append(w("why.waits"))
    if len(rungs) > 1:
        gains = [(_ratio(b, "autocast") - _ratio(a, "autocast"), a, b) for a, b in zip(rungs, rungs[1:])]
        _, before, top = max(gains, key=lambda g: g[0])
        out.append(
            w(
                "why.top",
                rung=top["rung"],
                change=w.name(top["change"]),
                before=f"{_ratio(before, 'autocast'):.2f}",
                after=f"{_ratio(top, 'autocast'):.2f}",
            )
        )
    if defaults is not None:
        busy = _cell(defaults, "autocast")["device_busy"]
        ratio = f"{_ratio(defaults, 'autocast'):.2f}"
        out.append(w("why.defaults", rung=defaults["rung"], ratio=ratio, busy=f"{busy:.0%}"))
        if _cell(defaults, "tf32"):  # explain measures tf32 on CUDA: AMP's gain against it too
            vs_tf32 = _ratio(defaults, "autocast") / _ratio(defaults, "tf32")
            out.append(
                w(
                    "why.tf32",
                    rung=defaults["rung"],
                    ratio=f"{vs_tf32:.2f}",
                    tf32=f"{_ratio(defaults, 'tf32'):.2f}",
                )
            )
    with_gs = [r for r in rungs if _cell(r, "autocast_gradscaler")]
    if with_gs:
        items = w.list(  # images/s ratios, as every other figure of the ladder
            f"{r['rung']} {_ratio(r, 'autocast_gradscaler') / _ratio(r, 'autocast'):.2f}x" for r in with_gs
        )
        out.append(w("why.gs", items=items))
    cross = res.get("crossover")
    if cross:
        tried = [r["batch"] for r in cross.get("rows", [])] or ["?"]

        def at(key: str) -> str:
            if cross.get(key):
                return w("why.from_batch", batch=cross[key])
            return w("why.no_batch", low=tried[0], high=tried[-1])

        out.append(w("why.cross", at15=at("autocast_1_5x_from_batch"), at2=at("autocast_2x_from_batch")))
    return [w.list(out, " ")]
