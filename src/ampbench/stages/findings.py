"""`ampbench findings`: docs/FINDINGS.md and its Chinese edition docs/FINDINGS.zh.md, the tutorial's
claims tested against measured runs.

    ampbench findings --bench reports/bench.json --explain reports/explain.json

Reads the study's and the tutorial-conditions study's metrics (and bench's and explain's JSON, if
given); the work is report/findings.py's ``main``.
"""

from __future__ import annotations

from pathlib import Path

from ampbench.config import Config


def main(cfg: Config, args, argv: list[str]) -> int:
    from ampbench.report import findings

    findings.main(
        Path(args.study),
        Path(args.tutorial),
        Path(args.bench) if args.bench else None,
        Path(args.out),
        Path(args.readme) if args.readme else None,
        cfg.report.equivalence_margin_pts,
        Path(args.explain) if args.explain else None,
    )
    print(f"wrote {args.out} and {findings.zh_path(Path(args.out))}")
    return 0
