"""``results/reference/seed_findings.md``: every seed-paper claim, our measurement, the pre-set test, the verdict,
the command (:mod:`~experiments.findings.cli`), its rows by paper and its prose computed from the result files."""
