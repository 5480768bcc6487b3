"""The docs are tested by the cluster: README's slurm.conf snippet is the snippet file the cluster uses."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_snippet_is_the_cluster_snippet() -> None:
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- snippet:begin -->\n```\n(.*?)```\n<!-- snippet:end -->", readme, re.S)
    assert m, "README.md lost its snippet markers"
    snippet = (ROOT / "contrib/slurm-docker-cluster/slurm/fleetyield-snippet.conf").read_text()
    assert m.group(1) == snippet


def test_readme_opens_with_the_two_commands() -> None:
    head = (ROOT / "README.md").read_text().split("\n\n")[1]
    assert "make demo" in head and "make test" in head


def test_readme_measured_table_is_the_sums_of_the_committed_ab_runs() -> None:
    """README's one table of measured figures: one row per committed A/B run, each rendered from its ab.json
    (the same numbers as the generated per-seed blocks, summed), so the table cannot drift from them."""
    import json

    from slurm_fleetyield.chaos import report

    readme = (ROOT / "README.md").read_text()
    marker = "<!-- measured-table:"
    assert marker in readme, "README.md lost its measured-results table"
    table = readme.split(marker, 1)[1].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines()[1:] if line.startswith("| ") and "---" not in line][1:]
    runs = [ROOT / "docs/ab/ab.json", ROOT / "docs/ab-precursor/ab.json"]
    expected = [report.summary_row(json.loads(p.read_text())) for p in runs if p.exists()]
    assert rows == expected


def test_readme_links_the_results_and_the_devlog() -> None:
    readme = (ROOT / "README.md").read_text()
    for doc in ("docs/results.md", "docs/devlog.md", "docs/admin-guide.md"):
        assert doc in readme and (ROOT / doc).exists(), doc
    # The manual carries no development-log material: session ("stop N") numbers belong in docs/devlog.md.
    assert not re.search(r"\bstop \d+\b", readme), re.findall(r".{40}\bstop \d+\b.{20}", readme)
