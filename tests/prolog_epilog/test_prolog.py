"""fleetyield-prolog run as a subprocess, the way slurmd runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

FATAL_79 = {
    "event_id": "e1",
    "time": 1.0,
    "gpu": 3,
    "uuid": "GPU-x",
    "kind": "xid",
    "xid": 79,
    "reset_fixes": True,
    "message": "XID 79: GPU has fallen off the bus",
}


def test_allow_writes_mapping_and_job_state(node: Any, hook: Any) -> None:
    res = hook("prolog", node.env(job_id="1001", gpus="0,2-3"))
    assert res.rc == 0, res.stderr
    for gpu in (0, 2, 3):
        assert (node.map_dir / str(gpu)).read_text() == "1001\n"
    assert not (node.map_dir / "1").exists()
    # no temp files left behind in the dcgm-exporter directory
    assert sorted(os.listdir(node.map_dir)) == ["0", "2", "3"]
    state = json.loads((node.spool / "jobs" / "1001.json").read_text())
    assert state["gpus"] == [0, 2, 3] and state["user"] == "alice"
    assert "allow" in node.log_file.read_text()
    assert "fleetyield-prolog[" in res.stderr and "job=1001" in res.stderr


def test_mapping_replaces_stale_entry_atomically(node: Any, hook: Any) -> None:
    node.map_dir.mkdir(parents=True)
    (node.map_dir / "0").write_text("999\n")  # a job whose epilog never ran
    ino_before = os.stat(node.map_dir / "0").st_ino
    assert hook("prolog", node.env(job_id="1002", gpus="0")).rc == 0
    assert (node.map_dir / "0").read_text() == "1002\n"
    # replaced by rename (new inode), never truncated in place
    assert os.stat(node.map_dir / "0").st_ino != ino_before


def test_no_gpus_no_mapping(node: Any, hook: Any) -> None:
    res = hook("prolog", node.env(gpus=None))
    assert res.rc == 0
    assert not node.map_dir.exists() or os.listdir(node.map_dir) == []


def test_cuda_visible_devices_fallback_and_nodevfiles(node: Any, hook: Any) -> None:
    env = node.env(gpus=None, CUDA_VISIBLE_DEVICES="5")
    assert hook("prolog", env).rc == 0
    assert (node.map_dir / "5").read_text() == "1001\n"
    env = node.env(job_id="1003", gpus=None, CUDA_VISIBLE_DEVICES="NoDevFiles")
    assert hook("prolog", env).rc == 0
    assert sorted(os.listdir(node.map_dir)) == ["5"]


def test_deny_on_pending_fatal_event(node: Any, hook: Any) -> None:
    node.write_fatal([FATAL_79])
    res = hook("prolog", node.env())
    assert res.rc != 0
    assert "DENY" in res.stderr and "XID 79" in res.stderr
    assert not node.map_dir.exists()  # a refused job gets no mapping


def test_empty_pending_list_allows(node: Any, hook: Any) -> None:
    node.write_fatal([])
    assert hook("prolog", node.env()).rc == 0


@pytest.mark.parametrize("content", ["{not json", '{"pending": 5}', "", '["x"]'])
def test_corrupt_fatal_marker_is_no_verdict(node: Any, hook: Any, content: str) -> None:
    node.agent_dir.mkdir(parents=True)
    (node.agent_dir / "fatal.json").write_text(content)
    res = hook("prolog", node.env())
    assert res.rc == 0, res.stderr
    assert "no verdict" in res.stderr


def test_unreadable_fatal_marker_is_no_verdict(node: Any, hook: Any) -> None:
    node.agent_dir.mkdir(parents=True)
    (node.agent_dir / "fatal.json").mkdir()  # EISDIR on read
    res = hook("prolog", node.env())
    assert res.rc == 0, res.stderr
    assert "no verdict" in res.stderr


def test_controller_allow(node: Any, hook: Any, gate: Any) -> None:
    node.write_conf(controller_url=gate.url)
    res = hook("prolog", node.env())
    assert res.rc == 0, res.stderr
    assert gate.requests == ["/v1/nodes/gpu-node-07/gate"]


def test_controller_deny(node: Any, hook: Any, gate: Any) -> None:
    gate.mode = "deny"
    node.write_conf(controller_url=gate.url)
    res = hook("prolog", node.env())
    assert res.rc != 0
    assert "quarantined: xid 79" in res.stderr


def test_fatal_checked_before_controller(node: Any, hook: Any, gate: Any) -> None:
    node.write_fatal([FATAL_79])
    node.write_conf(controller_url=gate.url)
    assert hook("prolog", node.env()).rc != 0
    assert gate.requests == []


@pytest.mark.parametrize("mode", ["garbage", "500"])
def test_controller_bad_answer_fails_open(node: Any, hook: Any, gate: Any, mode: str) -> None:
    gate.mode = mode
    node.write_conf(controller_url=gate.url)
    res = hook("prolog", node.env())
    assert res.rc == 0
    assert "fail-open" in res.stderr


def test_controller_down_fails_open(node: Any, hook: Any, dead_port: int) -> None:
    node.write_conf(controller_url=f"http://127.0.0.1:{dead_port}")
    res = hook("prolog", node.env())
    assert res.rc == 0
    assert "unreachable" in res.stderr


def test_controller_slow_fails_open_within_timeout(node: Any, hook: Any, gate: Any) -> None:
    gate.mode = "hang"
    node.write_conf(controller_url=gate.url, timeout_ms=200)
    res = hook("prolog", node.env())
    assert res.rc == 0
    assert "unreachable" in res.stderr and "TimeoutError" in res.stderr
    # 200 ms budget + interpreter start; far below the 2 s hard deadline
    assert res.wall_s < 1.5, res.wall_s
    assert (node.map_dir / "0").exists()  # the job still gets its mapping


def test_two_controllers_the_first_dead_the_second_answers(
    node: Any, hook: Any, gate: Any, blackhole: str, dead_port: int
) -> None:
    """High availability: the dead leader's URL first; the standby's deny still counts, within the
    budget, whether the dead one refuses at once or hangs (it gets an equal share of the timeout)."""
    gate.mode = "deny"
    for first in (f"http://127.0.0.1:{dead_port}", blackhole):
        gate.requests.clear()
        node.write_conf(controller_url=f"{first}, {gate.url}", timeout_ms=400)
        res = hook("prolog", node.env())
        assert res.rc != 0 and "quarantined: xid 79" in res.stderr, res.stderr
        assert "unreachable at" in res.stderr and "asking the next" in res.stderr
        assert gate.requests == ["/v1/nodes/gpu-node-07/gate"]
    gate.mode = "allow"
    node.write_conf(controller_url=f"{gate.url},http://127.0.0.1:{dead_port}")
    res = hook("prolog", node.env())
    assert res.rc == 0 and "WARNING" not in res.stderr, res.stderr  # the first answered: no second try


def test_controller_wait_clamped_to_hard_deadline(node: Any, hook: Any, blackhole: str) -> None:
    # A controller timeout larger than the hard deadline: the gate query is cut short so
    # the prolog still finishes its own work (mapping) inside the deadline.
    node.write_conf(controller_url=blackhole, timeout_ms=30000, hard_timeout_ms=500)
    res = hook("prolog", node.env(), timeout=10)
    assert res.rc == 0
    assert "unreachable" in res.stderr
    assert 0.4 <= res.wall_s < 2.0, res.wall_s
    assert (node.map_dir / "0").exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_hard_deadline_on_hung_filesystem(node: Any, hook: Any) -> None:
    # A FIFO with no writer blocks open(2) forever: a stand-in for a hung mount.
    node.agent_dir.mkdir(parents=True)
    os.mkfifo(node.agent_dir / "fatal.json")
    node.write_conf(hard_timeout_ms=400)
    res = hook("prolog", node.env(), timeout=10)
    assert res.rc == 0
    assert "hard deadline passed" in res.stderr
    assert res.wall_s < 2.0, res.wall_s


def test_bad_config_uses_defaults_and_allows(node: Any, hook: Any, tmp_path: Any) -> None:
    node.conf_path.write_text("controller_url http://typo\ntimeout_ms = abc\nbogus_key = 1\n[[[\n")
    env = node.env(
        FLEETYIELD_AGENT_STATE_DIR=str(node.agent_dir),
        FLEETYIELD_HPC_JOB_DIR=str(node.map_dir),
        FLEETYIELD_SPOOL_DIR=str(node.spool),
        FLEETYIELD_LOG_FILE=str(node.log_file),
    )
    res = hook("prolog", env)
    assert res.rc == 0
    assert "does not parse" in res.stderr and "using defaults" in res.stderr


def test_bad_value_keeps_default_and_logs(node: Any, hook: Any) -> None:
    node.write_conf(timeout_ms="abc", unknown_key="x")
    res = hook("prolog", node.env())
    assert res.rc == 0
    assert "bad value for 'timeout_ms'" in res.stderr
    assert "unknown key 'unknown_key'" in res.stderr


def test_toml_config(node: Any, hook: Any, gate: Any) -> None:
    gate.mode = "deny"
    node.conf_path.write_text(
        "[hooks]\n"
        f'agent_state_dir = "{node.agent_dir}"\n'
        f'hpc_job_dir = "{node.map_dir}"\n'
        f'spool_dir = "{node.spool}"\n'
        f'log_file = "{node.log_file}"\n'
        f'controller_url = "{gate.url}"\n'
        "timeout_ms = 300\n"
        "hpc_job_mapping = true\n"
        "extra = [1, 2]\n"  # forces the tomllib path; unknown key is just logged
    )
    res = hook("prolog", node.env())
    assert res.rc != 0, res.stderr
    assert "unknown key 'extra'" in res.stderr


def test_missing_job_id_allows(node: Any, hook: Any) -> None:
    env = node.env()
    del env["SLURM_JOB_ID"]
    res = hook("prolog", env)
    assert res.rc == 0
    assert "missing or invalid" in res.stderr


def test_path_traversal_job_id_rejected(node: Any, hook: Any) -> None:
    res = hook("prolog", node.env(job_id="../../etc/x"))
    assert res.rc == 0
    assert not (node.spool / "jobs").exists()


def test_unwritable_mapping_dir_still_allows(node: Any, hook: Any) -> None:
    node.map_dir.parent.mkdir(parents=True, exist_ok=True)
    node.map_dir.write_text("not a directory")
    res = hook("prolog", node.env())
    assert res.rc == 0
    assert "cannot write hpc_job mapping" in res.stderr


def test_works_without_node_agent_package(node: Any, hook: Any, tmp_path: Any) -> None:
    # Simulate a node where only prolog_epilog is installed: the fallback reader is used.
    shadow = tmp_path / "shadow"
    (shadow / "node_agent").mkdir(parents=True)
    (shadow / "node_agent" / "__init__.py").write_text("raise ImportError('not installed')\n")
    node.write_fatal([FATAL_79])
    env = node.env(PYTHONPATH=str(shadow))
    assert hook("prolog", env).rc != 0
    (node.agent_dir / "fatal.json").write_text("{corrupt")
    assert hook("prolog", env).rc == 0


def test_console_script_entry_point(node: Any) -> None:
    script = shutil.which("fleetyield-prolog", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("fleetyield-prolog console script not installed (pip install -e .)")
    proc = subprocess.run([script], env=node.env(), capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("extra", "allowed"),
    [
        ({"SLURM_JOB_UID": "0", "SLURM_JOB_NAME": "fy_canary_ab12"}, True),
        ({"SLURM_JOB_UID": "0", "SLURM_JOB_CONSTRAINTS": "fy_canary"}, True),
        ({"SLURM_JOB_UID": "1000", "SLURM_JOB_NAME": "fy_canary_ab12"}, False),  # a user cannot pose as one
        ({"SLURM_JOB_UID": "0", "SLURM_JOB_NAME": "train"}, False),  # root's other jobs are gated too
    ],
)
def test_controller_canary_passes_pending_fatal_events(
    node: Any, hook: Any, extra: dict[str, str], allowed: bool
) -> None:
    # The canary is the check of a node with pending events: refusing it would let Slurm drain the node as
    # "Prolog error", which FleetYield must then treat as someone else's drain.
    node.write_fatal([FATAL_79])
    env = node.env()
    env.update(extra)
    assert (hook("prolog", env).rc == 0) is allowed


# --------------------------------------------------------------------------------------------------------
# The gate behind the controller's web-config (TLS, basic auth): issue 27, item 1
# --------------------------------------------------------------------------------------------------------


def _auth_refused_line(res: Any) -> str:
    lines = [line for line in res.stderr.splitlines() if "AUTH REFUSED" in line]
    assert lines, res.stderr
    return lines[0]


def test_the_gate_behind_basic_auth_answers_with_the_right_credentials(
    node: Any, hook: Any, protected_api: Any, tmp_path: Path
) -> None:
    url = protected_api.start()
    node.write_conf(
        controller_url=url,
        timeout_ms=3000,
        hard_timeout_ms=6000,
        controller_basic_auth_username="prolog",
        controller_basic_auth_password_file=protected_api.password_file(),
    )
    res = hook("prolog", node.env(SLURMD_NODENAME="gpu-02"))
    assert res.rc == 1, res.stderr  # the real verdict: gpu-02 is quarantined
    assert "DENY: controller quarantines gpu-02: fleetyield: node quarantined" in res.stderr
    assert hook("prolog", node.env(SLURMD_NODENAME="gpu-03")).rc == 0  # and a green node is allowed
    assert protected_api.refused() == 0


@pytest.mark.parametrize("credentials", ["none", "wrong password", "unreadable password file"])
def test_refused_credentials_are_a_loud_configuration_error_not_an_outage(
    node: Any, hook: Any, protected_api: Any, tmp_path: Path, credentials: str
) -> None:
    """Fail-open by policy (prolog.py, "Refused credentials"), but never silently: an ERROR line in the
    hook's log that says AUTH REFUSED, what was sent and what to set, unlike a controller that is down."""
    url = protected_api.start()
    auth: dict[str, object] = {}
    if credentials == "wrong password":
        auth = {"controller_basic_auth_password_file": protected_api.password_file("guessed")}
    elif credentials == "unreadable password file":
        auth = {"controller_basic_auth_password_file": tmp_path / "nowhere"}
    if auth:
        auth["controller_basic_auth_username"] = "prolog"
    node.write_conf(controller_url=url, timeout_ms=3000, hard_timeout_ms=6000, **auth)
    res = hook("prolog", node.env(SLURMD_NODENAME="gpu-02"))
    assert res.rc == 0, res.stderr  # allowed, but:
    line = _auth_refused_line(res)
    assert " ERROR " in line and "configuration error" in line and "the health gate is off" in line
    assert "unreachable" not in line
    if credentials == "unreadable password file":
        assert "controller_basic_auth_password_file: cannot read" in line and "nowhere" in line
        assert protected_api.refused() == 0  # nothing was sent
    else:
        sent = "no credentials" if credentials == "none" else "user 'prolog'"
        assert "HTTP 401" in line and sent in line, line
        assert protected_api.refused() == 1  # and the controller counted it (doctor, /metrics)
    assert line in node.log_file.read_text()  # in hooks.log too, where the admin looks


def test_the_gate_over_tls_with_basic_auth(node: Any, hook: Any, protected_api: Any, tmp_path: Path) -> None:
    url = protected_api.start(tls=True)
    conf = {
        "controller_url": url,
        "timeout_ms": 3000,
        "hard_timeout_ms": 6000,
        "controller_basic_auth_username": "prolog",
        "controller_basic_auth_password_file": protected_api.password_file(),
    }
    node.write_conf(**conf, controller_tls_config_ca_file=protected_api.pki["ca"])
    res = hook("prolog", node.env(SLURMD_NODENAME="gpu-02"))
    assert res.rc == 1 and "DENY: controller quarantines gpu-02" in res.stderr, res.stderr
    node.write_conf(**conf)  # no CA: the controller's certificate does not verify
    res = hook("prolog", node.env(SLURMD_NODENAME="gpu-02"))
    assert res.rc == 0, res.stderr
    line = _auth_refused_line(res)
    assert "does not verify" in line and "controller_tls_config_ca_file" in line, line


def test_toml_hooks_conf_takes_the_agents_table_shapes(
    node: Any, hook: Any, protected_api: Any, tmp_path: Path
) -> None:
    url = protected_api.start(tls=True)
    password = protected_api.password_file()
    node.conf_path.write_text(
        f'[hooks]\nagent_state_dir = "{node.agent_dir}"\nhpc_job_dir = "{node.map_dir}"\n'
        f'spool_dir = "{node.spool}"\nlog_file = "{node.log_file}"\ncontroller_url = "{url}"\n'
        "timeout_ms = 3000\nhard_timeout_ms = 6000\n"
        f'controller_basic_auth = {{username = "prolog", password_file = "{password}"}}\n'
        f'[hooks.controller_tls_config]\nca_file = "{protected_api.pki["ca"]}"\n'
    )
    res = hook("prolog", node.env(SLURMD_NODENAME="gpu-02"))
    assert res.rc == 1 and "DENY: controller quarantines gpu-02" in res.stderr, res.stderr
