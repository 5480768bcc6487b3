"""FleetYield's hooks compose with a site's own (issue 29): the snippet sets ``Prolog=/etc/slurm/prolog.d/*``
and ``Epilog=/etc/slurm/epilog.d/*``, and the docker cluster has a pre-existing site Prolog and Epilog there
(``slurm/prolog.d/10-site-prolog``, ``slurm/epilog.d/10-site-epilog``) beside FleetYield's ``50-fleetyield``
links. A job runs both: the site's hooks record it in ``/var/log/slurm/site-hooks.log``, FleetYield's in
``/var/log/fleetyield/hooks.log``, on the node that ran it. No fixed sleeps: polled with deadlines."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

pytestmark = pytest.mark.integration
FAILED = {"FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL"}


def test_the_slurmd_runs_the_snippets_globs(cluster: Any) -> None:
    conf = cluster.ctl("scontrol", "show", "config")
    assert re.search(r"^Prolog\s*=\s*/etc/slurm/prolog\.d/\*$", conf, re.M), conf
    assert re.search(r"^Epilog\s*=\s*/etc/slurm/epilog\.d/\*$", conf, re.M), conf


def test_a_site_prolog_and_epilog_keep_running_beside_fleetyields(cluster: Any) -> None:
    tag = uuid.uuid4().hex[:8]
    job_id = cluster.ctl(
        "sbatch", "--parsable", "--gres=gpu:1", f"--job-name=fy-site-{tag}", "--output=/dev/null",
        "--comment=fy:batch", "--wrap", "true",
    ).strip()  # fmt: skip
    assert job_id.isdigit(), job_id

    def completed_on() -> str | None:
        out = cluster.ctl("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,NodeList").strip()
        if not out:
            return None
        state, node = out.splitlines()[0].split("|")
        assert state.split()[0] not in FAILED, out
        return node if state == "COMPLETED" else None

    node = cluster.poll(completed_on, timeout=120, what=f"job {job_id} COMPLETED in sacct")

    def logged(path: str, *needles: str) -> str | None:
        text = cluster.exec(node, "cat", path, check=False).stdout
        return text if all(n in text for n in needles) else None

    # The Epilog runs after the job is COMPLETED in accounting: poll for it too.
    site = cluster.poll(
        lambda: logged("/var/log/slurm/site-hooks.log", f"prolog job={job_id} ", f"epilog job={job_id} "),
        timeout=60,
        what=f"the site's prolog and epilog for job {job_id} in {node}:/var/log/slurm/site-hooks.log",
    )
    assert f"node={node}" in site
    ours = cluster.poll(
        lambda: logged("/var/log/fleetyield/hooks.log", f"job={job_id} "),
        timeout=60,
        what=f"FleetYield's hooks for job {job_id} in {node}:/var/log/fleetyield/hooks.log",
    )
    lines = [ln for ln in ours.splitlines() if f" job={job_id} " in ln]
    assert any("fleetyield-prolog[" in ln and "allow" in ln for ln in lines), lines
    assert any("fleetyield-epilog[" in ln for ln in lines), lines
