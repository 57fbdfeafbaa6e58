"""A study's identity in the tracking store.

Each ``compare`` stamps the variant runs it summarised with its own run id (tag ``ampbench.study``):
the link the study prints (tracking/view.py's shared view) filters on it, so a re-run, a second
``dvc exp run`` or a demo run three times shows one study, not three rows per variant. Variant
runs of earlier studies stay in the store, reachable in the runs table without that filter, and
carry the study that replaced them (``ampbench.superseded_by``).
"""

from __future__ import annotations

import re

KIND_FILTER = "tags.`ampbench.kind` = 'variant'"
STUDY_TAG = "ampbench.study"
SUPERSEDED_TAG = "ampbench.superseded_by"


def runs_filter(study: str | None) -> str:
    """The runs table's filter: the variant runs of `study` (a compare run id), or every one."""
    return KIND_FILTER + (f" and tags.`{STUDY_TAG}` = '{study}'" if study else "")


def of_filter(search: str) -> str | None:
    """The study a runs-table filter shows (``runs_filter``'s inverse), None for every study."""
    found = re.search(rf"tags\.`{re.escape(STUDY_TAG)}` = '([^']+)'", search)
    return found.group(1) if found else None


def mark_earlier(tracker, ours: set[str], study: str) -> None:
    """Variant runs of the experiment outside this study: tagged with the study that replaced
    them, once; this study's runs: untagged."""
    runs = tracker.client.search_runs([tracker.experiment_id()], KIND_FILTER, max_results=5000)
    for run in runs:
        marked = SUPERSEDED_TAG in run.data.tags
        if run.info.run_id not in ours and not marked:
            tracker.set_tags(run.info.run_id, {SUPERSEDED_TAG: study})
        elif run.info.run_id in ours and marked:  # back in a study (DVC's run cache reuses runs)
            tracker.client.delete_tag(run.info.run_id, SUPERSEDED_TAG)
