"""Reports built from the evaluate stage's metrics files: the comparison and docs/FINDINGS.md."""
