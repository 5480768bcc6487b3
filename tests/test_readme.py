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
