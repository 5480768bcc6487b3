"""End-to-end checks of the docker Slurm cluster (contrib/slurm-docker-cluster).

Run with ``make test`` (brings the cluster up when needed) or ``.venv/bin/pytest -m integration``.
No fixed sleeps: everything that takes time is polled with a deadline.
"""

from __future__ import annotations

import re
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Helpers live in conftest.py and reach the tests through the ``cluster`` fixture
# (tests/ is not a package, so conftest is not importable).
REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER_DIR = REPO_ROOT / "contrib" / "slurm-docker-cluster"
NODES = {"gpu-h100-1": "h100", "gpu-h100-2": "h100", "gpu-l40s-1": "l40s", "gpu-l40s-2": "l40s"}
SNIPPET_FILE = CLUSTER_DIR / "slurm" / "fleetyield-snippet.conf"
SLURM_CONF = CLUSTER_DIR / "slurm" / "slurm.conf"
TEMP_RE = re.compile(r'^DCGM_FI_DEV_GPU_TEMP\{[^}]*\bgpu="(\d+)"', re.MULTILINE)


def gpus_with_temp(metrics_text: str) -> set[int]:
    """GPU indices that have a DCGM_FI_DEV_GPU_TEMP series in a /metrics page."""
    return {int(g) for g in TEMP_RE.findall(metrics_text)}


# --- no cluster needed ------------------------------------------------------------------------


def test_snippet_is_marked_and_in_repo_slurm_conf() -> None:
    snippet = SNIPPET_FILE.read_text()
    lines = snippet.strip().splitlines()
    assert lines[0] == "# --- BEGIN FleetYield ---"
    assert lines[-1] == "# --- END FleetYield ---"
    assert "Prolog=/etc/slurm/prolog.d/*" in lines  # beside the site's own hooks, not instead of them
    assert "Epilog=/etc/slurm/epilog.d/*" in lines
    assert "#   ln -s /opt/fleetyield/bin/fleetyield-prolog /etc/slurm/prolog.d/50-fleetyield" in lines
    assert "#   ln -s /opt/fleetyield/bin/fleetyield-epilog /etc/slurm/epilog.d/50-fleetyield" in lines
    assert "PrologFlags=Alloc,DeferBatch" in lines
    assert "JobSubmitPlugins=lua" in lines
    conf = SLURM_CONF.read_text()
    assert snippet in conf, "slurm/slurm.conf must contain slurm/fleetyield-snippet.conf verbatim"
    assert conf.count("# --- BEGIN FleetYield ---") == 1


def test_spares_snippet_is_in_repo_slurm_conf() -> None:
    spares = (CLUSTER_DIR / "slurm" / "fleetyield-spares.conf").read_text()
    lines = spares.strip().splitlines()
    assert lines[0] == "# --- BEGIN FleetYield hot spares ---"
    assert lines[-1] == "# --- END FleetYield hot spares ---"
    assert {"PreemptType=preempt/qos", "PreemptMode=REQUEUE"} <= set(lines)
    conf = SLURM_CONF.read_text()
    assert spares in conf, "slurm/slurm.conf must contain slurm/fleetyield-spares.conf verbatim"
    assert "JobRequeue=1" in conf.splitlines(), "PreemptMode=REQUEUE needs requeueable jobs"


def test_gpus_with_temp_parser() -> None:
    text = (
        "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n"
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",Hostname="n"} 40\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="7",UUID="GPU-b",Hostname="n"} 41\n'
        'DCGM_FI_DEV_POWER_USAGE{gpu="3",UUID="GPU-c",Hostname="n"} 300\n'
    )
    assert gpus_with_temp(text) == {0, 7}


# --- against the running cluster --------------------------------------------------------------


@pytest.mark.integration
def test_slurm_conf_in_cluster_contains_snippet(cluster: Any) -> None:
    conf = cluster.exec("slurmctld", "cat", "/etc/slurm/slurm.conf").stdout
    assert SNIPPET_FILE.read_text() in conf
    for node in NODES:
        for kind in ("prolog", "epilog"):
            link = cluster.exec(node, "readlink", "-f", f"/etc/slurm/{kind}.d/50-fleetyield").stdout.strip()
            assert link.startswith("/opt/fleetyield/"), (node, kind, link)
            assert cluster.exec(node, "test", "-x", f"/opt/fleetyield/bin/fleetyield-{kind}").returncode == 0


@pytest.mark.integration
def test_every_container_runs_the_debian_package_an_admin_installs(cluster: Any) -> None:
    """The images install contrib/deb/build-deb.sh's .deb (what `make package` makes), not a wheel: every
    role's FleetYield executables are the package's files, at the repository's version."""
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    for container in ("fleetyield", "slurmctld", *NODES):
        status = cluster.exec(container, "dpkg-query", "-W", "-f=${Status} ${Version}", "fleetyield").stdout
        assert status == f"install ok installed {version}", (container, status)
        for exe in ("fleetyield", "fleetyield-agent", "fleetyield-prolog", "fleetyield-epilog"):
            owner = cluster.exec(container, "dpkg-query", "-S", f"/opt/fleetyield/bin/{exe}").stdout
            assert owner.startswith("fleetyield: "), (container, exe, owner)
    out = cluster.exec("fleetyield", "fleetyield", "--version").stdout
    assert out.strip() == f"fleetyield {version}", out


@pytest.mark.integration
def test_every_node_registers_with_its_gres(cluster: Any) -> None:
    def all_idle() -> dict[str, dict[str, str]] | None:
        info = cluster.node_info()
        states = {n: info.get(n, {}).get("State") for n in NODES}
        return info if all(s == "IDLE" for s in states.values()) else None

    info = cluster.poll(all_idle, timeout=120, what="every node IDLE")
    for node, model in NODES.items():
        fields = info[node]
        assert fields["Gres"] == f"gpu:{model}:8", fields
        assert f"gres/gpu:{model}=8" in fields["CfgTRES"], fields
        assert fields["CPUTot"] == "16"
        assert fields["RealMemory"] == "65536"
        # The admin's own features are there (FleetYield must keep them).
        assert model in fields["AvailableFeatures"].split(","), fields
    assert "nvlink" in info["gpu-h100-1"]["AvailableFeatures"].split(",")
    sinfo = cluster.ctl("sinfo", "-h", "-o", "%P %D %G")
    assert sorted(sinfo.splitlines()) == ["gpu* 2 gpu:h100:8", "gpu* 2 gpu:l40s:8"], sinfo


@pytest.mark.integration
def test_hostlist_expansion(cluster: Any) -> None:
    out = cluster.ctl("scontrol", "show", "hostnames", "gpu-h100-[1-2]")
    assert out.split() == ["gpu-h100-1", "gpu-h100-2"]
    out = cluster.ctl("scontrol", "show", "hostlist", "gpu-l40s-1,gpu-l40s-2")
    assert out.strip() == "gpu-l40s-[1-2]"


@pytest.mark.integration
def test_sbatch_gpu_job_output_and_accounting(cluster: Any) -> None:
    tag = uuid.uuid4().hex[:8]
    out_path = f"/shared/fy-it-{tag}-%j.out"
    job_id = cluster.ctl(
        "sbatch",
        "--parsable",
        "--gres=gpu:2",
        f"--job-name=fy-it-{tag}",
        f"--output={out_path}",
        "--wrap",
        'echo "tag=' + tag + ' host=$(hostname) gpus=$CUDA_VISIBLE_DEVICES"',
    ).strip()
    assert job_id.isdigit(), job_id

    def accounted_state() -> str | None:
        out = cluster.ctl("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,NodeList,AllocTRES")
        if not out.strip():
            return None
        state = out.split("|", 1)[0]
        assert state not in {"FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY"}, out
        return out.strip() if state == "COMPLETED" else None

    record = cluster.poll(accounted_state, timeout=120, what=f"job {job_id} COMPLETED in sacct")
    _state, node, tres = record.split("|")
    assert node in NODES
    assert "gres/gpu=2" in tres, tres

    # Written on the compute node, read from slurmctld: the /shared volume is really shared.
    path = out_path.replace("%j", job_id)
    text = cluster.poll(
        lambda: cluster.exec("slurmctld", "cat", path, check=False).stdout,
        timeout=30,
        what=f"{path} on the shared volume",
    )
    match = re.search(r"tag=(\w+) host=(\S+) gpus=(\S+)", text)
    assert match, text
    assert match.group(1) == tag
    assert match.group(2) == node
    assert len(match.group(3).split(",")) == 2, text


@pytest.mark.integration
@pytest.mark.parametrize("node", sorted(NODES))
def test_agent_metrics_reachable_over_cluster_network(cluster: Any, node: str) -> None:
    text = cluster.poll(
        lambda: cluster.metrics(node),
        timeout=60,
        what=f"http://{node}:9400/metrics from slurmctld",
    )
    assert gpus_with_temp(text) == set(range(8)), text[:2000]
    assert NODES[node] in text.lower()  # the model name appears in the labels


@pytest.mark.integration
def test_doctor_on_the_cluster_finds_slurm_the_agents_and_gpu_indices_in_order(cluster: Any) -> None:
    """``fleetyield doctor`` as an admin runs it in the controller's container, against the real slurmctld
    and agents: the fake GPUs' device minors follow their NVML indices, so gpu_index is OK."""
    import json

    out = cluster.exec(
        "fleetyield", "fleetyield", "doctor", "--config", "/etc/fleetyield/fleetyield.toml", "--json",
        "--only", "slurm", "--only", "agents", "--only", "gpu_index", check=False,
    ).stdout  # fmt: skip
    found = {f["check"]: f for f in json.loads(out)["findings"]}
    assert {c: found[c]["status"] for c in ("config", "slurm", "agents", "gpu_index")} == dict.fromkeys(
        ("config", "slurm", "agents", "gpu_index"), "OK"
    ), found
    assert found["gpu_index"]["detail"].startswith(f"{8 * len(NODES)} GPUs on {len(NODES)} nodes"), found


@pytest.fixture
def xid79_on_l40s_1(cluster: Any) -> Iterator[str]:
    node = "gpu-l40s-1"
    cluster.exec(
        node,
        "fleetyield-agent",
        "fault",
        "inject",
        "--state-dir",
        cluster.agent_state_dir,
        "--gpu",
        "3",
        "--xid",
        "79",
    )
    yield node
    # The controller has quarantined the node by now (drain, reboot ladder, probation): the next test that
    # uses the `world` fixture must reset the cluster first.
    cluster._fy_clean = False
    # Leave the node healthy for whoever runs next.
    cluster.exec(
        node,
        "fleetyield-agent",
        "fault",
        "clear",
        "--all",
        "--state-dir",
        cluster.agent_state_dir,
        check=False,
    )
    cluster.poll(
        lambda: gpus_with_temp(cluster.metrics(node)) == set(range(8)),
        timeout=60,
        what=f"{node} back to 8 GPUs after clearing the fault",
    )


@pytest.mark.integration
def test_fault_injection_shows_on_that_node_only(cluster: Any, xid79_on_l40s_1: str) -> None:
    faulty = xid79_on_l40s_1
    cluster.poll(
        lambda: gpus_with_temp(cluster.metrics(faulty)) == set(range(8)) - {3},
        timeout=60,
        what=f"GPU 3 of {faulty} to vanish from its metrics after XID 79",
    )
    for node in NODES:
        if node != faulty:
            assert gpus_with_temp(cluster.metrics(node)) == set(range(8)), node
