"""`ampbench findings`: docs/FINDINGS.md, the tutorial's four claims tested against measured runs.

    ampbench findings --study reports --tutorial tutorial/reports --bench reports/bench.json

Reads the metrics files evaluate writes (``<dir>/metrics/<variant>.json``) for two studies: the
project's defaults (``make run``) and the tutorial's conditions (``make tutorial``), plus,
optionally, ``ampbench bench``'s JSON (where a step's time goes). Nothing is typed by hand: every
number comes from those files and names the MLflow runs it came from. Each claim ends in a
verdict line of a fixed form, ``**Verdict (claim N): <verdict>** — <reason>``, with one of
VERDICTS; the README's summary block is filled from them (``--readme``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ampbench.report import claims, ladder, mixed, savings, speed_claims
from ampbench.report.sentences import ENGLISH, Words
from ampbench.seed_result import unusable

VERDICTS = claims.VERDICTS
SINGLE = ("single-fp32", "single-autocast", "single-autocast_gradscaler")
README_START, README_END = "<!-- findings:start -->", "<!-- findings:end -->"


class FindingsError(FileNotFoundError):
    """An input the report needs is missing or unreadable; the message says how to make it."""


def load_study(folder: Path, label: str, how: str) -> dict[str, dict]:
    """{variant: metrics} of one study's reports folder; the three single variants are required."""
    metrics = folder / "metrics"
    found = {}
    for path in sorted(metrics.glob("*.json")):
        try:
            found[path.stem] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise FindingsError(
                f"{path}: not readable as JSON ({err}); re-run its evaluate stage: {how}"
            ) from None
        if fault := unusable(found[path.stem]):
            raise FindingsError(f"{path}: not a metrics file ({fault}); re-run its evaluate stage: {how}")
    missing = [v for v in SINGLE if v not in found]
    if missing:
        names = ", ".join(f"{metrics}/{v}.json" for v in missing)
        raise FindingsError(  # hostile pass K: where params.yaml leaves them out, `how` alone makes none
            f"{label}: missing {names} (written by `ampbench evaluate`); findings needs the three single "
            f"variants ({', '.join(SINGLE)}): produce them with {how}, with params.yaml's `variants` "
            "naming them (`parallel` with single, `precision` with all three)"
        )
    if differ := mixed.differences(found):  # hostile pass Z: tf32 of 3 epochs weighed against 2
        raise FindingsError(
            f"{label}: {metrics}/ holds variants trained with different settings ({'; '.join(differ)}), "
            "so its claims would weigh two studies against each other; set params.yaml to the settings "
            f"the study should have and run {how} again (it re-trains the variants trained otherwise)"
            + mixed.by_hand(found)
        )
    return found


def load_bench(path: Path | None) -> dict | None:
    """`ampbench bench`'s JSON, or None. Rows are read by measure/variant/images_per_second/ms_per_step
    only: extra keys (e.g. medians over windows) are ignored."""
    if path is None:
        return None
    if not path.exists():
        raise FindingsError(
            f"--bench {path}: not found; make it with `ampbench bench --batch-size 128 --profile 20 --out "
            f"{path.with_suffix('')}` on the GPU, or leave --bench out"
        )
    res = json.loads(path.read_text(encoding="utf-8"))
    bad = [r for r in res.get("rows", []) if not {"measure", "variant", "images_per_second"} <= set(r)]
    if bad or not res.get("rows"):
        raise FindingsError(
            f"--bench {path}: rows without measure/variant/images_per_second; re-run ampbench bench"
        )
    return res


def build(
    project: dict,
    tutorial: dict,
    bench: dict | None,
    sources: dict[str, str],
    margin_pts: float = 0.5,
    explain: dict | None = None,
    w: Words = ENGLISH,
    other_edition: str = "",
) -> str:
    """The whole FINDINGS text in `w`'s language. `sources`: {input: path}, inputs named by the
    keys of words' "source.<input>" sentences (study, tutorial, bench, explain); `other_edition`:
    the other language's file name, linked at the top."""
    studies = {claims.TUTORIAL: tutorial, claims.PROJECT: project}
    sections = [
        speed_claims.claim1(studies, bench, w),
        speed_claims.claim2(studies, bench, w),
        claims.claim3(studies, margin_pts, w),
        claims.claim4(studies, w),
    ]
    inputs = w.list((f"{w.source(k)} `{v}`" for k, v in sources.items()), "; ")
    head = [
        w("title"),
        "",
        w("edition", name=other_edition or ("FINDINGS.zh.md" if w.lang == "en" else "FINDINGS.md")),
        "",
        w("intro", inputs=inputs),
        "",
        w("retold"),
        "",
        claims.conditions_table(studies, w),
        "",
        w("summary"),
        "",
        *summary_lines(sections, w),
    ]
    why = [ladder.section(explain, w), savings.section(studies, w)]
    body = [*sections[:2], *why, *sections[2:]]  # the why right after the speed claims it explains
    return "\n".join(head) + "\n\n" + "\n\n".join(body) + "\n"


def verdicts(text: str, w: Words = ENGLISH) -> dict[int, tuple[str, str]]:
    """{claim: (verdict, reason)} parsed from the report's verdict lines, verdicts as `w` says them."""
    pattern = re.escape(w("verdict", n="@N", what="@W", reason="@R"))
    pattern = pattern.replace("@N", r"(\d)").replace("@W", r"([^*]+)").replace("@R", "(.+)")
    found = re.findall(f"^{pattern}$", text, flags=re.M)
    return {int(n): (v, reason) for n, v, reason in found}


def summary_lines(sections: list[str], w: Words = ENGLISH) -> list[str]:
    """One line per claim: the tutorial's claim, then our verdict (also the README's block)."""
    found = verdicts("\n".join(sections), w)
    return [
        w("summary.line", n=n, claim=w.name(claims.CLAIMS[n]), what=found[n][0], reason=found[n][1])
        for n in sorted(found)
    ]


def update_readme(readme: Path, report: Path, lines: list[str]) -> bool:
    """Replace the block between the findings markers in the README; False when it has none."""
    if not readme.exists():
        return False
    text = readme.read_text(encoding="utf-8")
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        return False
    link = f"The tutorial's claims, tested ([{report.as_posix()}]({report.as_posix()}), generated):\n\n"
    block = README_START + "\n" + link + "\n".join(lines) + "\n" + README_END
    readme.write_text(text[:start] + block + text[end + len(README_END) :], encoding="utf-8")
    return True


def main(
    study: Path,
    tutorial: Path,
    bench: Path | None,
    out: Path,
    readme: Path | None,
    margin_pts: float = 0.5,
    explain: Path | None = None,
) -> str:
    """Write `out` (English) and its Chinese edition beside it (FINDINGS.md -> FINDINGS.zh.md), from
    the same inputs; refresh the README's block; the English text."""
    project_runs = load_study(study, "the project's study", "`make run` (or `dvc repro`)")
    tutorial_runs = load_study(
        tutorial,
        "the tutorial-conditions study",
        "`make tutorial DATA=<path or URL>`",  # hostile pass L: a plain `dvc repro` there keeps its own store
    )
    sources = {"study": str(study), "tutorial": str(tutorial)}
    sources.update({k: str(v) for k, v in (("bench", bench), ("explain", explain)) if v})
    inputs = (project_runs, tutorial_runs, load_bench(bench), sources, margin_pts, ladder.load(explain))
    out.parent.mkdir(parents=True, exist_ok=True)
    zh_out = zh_path(out)
    text = build(*inputs, other_edition=zh_out.name)
    out.write_text(text, encoding="utf-8")
    zh_out.write_text(build(*inputs, w=Words("zh"), other_edition=out.name), encoding="utf-8")
    if readme is not None:
        update_readme(readme, out, summary_lines([text]))
    return text


def zh_path(out: Path) -> Path:
    """The Chinese edition's file beside the English one: docs/FINDINGS.md -> docs/FINDINGS.zh.md."""
    return out.with_name(f"{out.stem}.zh{out.suffix or '.md'}")
