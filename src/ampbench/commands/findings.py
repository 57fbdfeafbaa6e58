"""`ampbench findings`: docs/FINDINGS.md and its Chinese edition docs/FINDINGS.zh.md, the tutorial's
claims tested against measured runs.

    ampbench findings --bench reports/bench.json --explain reports/explain.json

Reads the study's and the tutorial-conditions study's metrics (and bench's and explain's JSON, if
given); the work is report/findings_report.py's ``main``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ampbench.config import Config


def add_arguments(f: argparse.ArgumentParser) -> None:
    f.add_argument("--study", default="reports", help="the project's reports folder (default: %(default)s)")
    f.add_argument(
        "--tutorial",
        default="tutorial/reports",
        help="the tutorial-conditions reports folder (make tutorial; default: %(default)s)",
    )
    f.add_argument("--bench", default="", help="ampbench bench's JSON, e.g. reports/bench.json (optional)")
    f.add_argument(
        "--explain", default="", help="ampbench explain's JSON, e.g. reports/explain.json (optional): the why"
    )
    f.add_argument(
        "--out",
        default="docs/FINDINGS.md",
        help="the English edition; the Chinese one goes beside it (FINDINGS.zh.md); default: %(default)s",
    )
    f.add_argument(
        "--readme",
        default="README.md",
        help="README whose findings block is refreshed "
        "(between <!-- findings:start/end --> markers, if any); empty: none",
    )


def main(cfg: Config, args, argv: list[str]) -> int:
    from ampbench.report import findings_report

    findings_report.main(
        Path(args.study),
        Path(args.tutorial),
        Path(args.bench) if args.bench else None,
        Path(args.out),
        Path(args.readme) if args.readme else None,
        cfg.report.equivalence_margin_pts,
        Path(args.explain) if args.explain else None,
    )
    print(f"wrote {args.out} and {findings_report.zh_path(Path(args.out))}")
    return 0
