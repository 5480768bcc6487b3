"""Issue 27 item 3's remaining edge: the agent remembers an executed reset ``request_id`` at least as long as
the controller may send it again (node_agent/protocol.py ``reset_id_memory_s``, node_agent/remote.py,
slurm_fleetyield/executor.py ``AGENT_REMEMBERS_S``). Before, the agent kept ids 2 x its max_skew_s and the
executor resent for a hard-coded 600 s: equal at the default skew, and with a shorter skew a resend of a
reset already done was done again. A real agent (fake backend), a virtual clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rig import write_secret

from node_agent.config import build_config
from node_agent.exporter import Server
from node_agent.protocol import ResetRequest, reset_id_memory_s, signed_headers
from node_agent.remote import ResetEndpoint
from slurm_fleetyield.executor import AGENT_REMEMBERS_S

SECRET = b"reset-memory-secret-0123"


@pytest.mark.parametrize("max_skew_s", [30.0, 120.0, 300.0, 900.0])
def test_a_resend_inside_the_executors_window_is_refused_and_its_id_kept(
    tmp_path: Path, max_skew_s: float
) -> None:
    assert reset_id_memory_s(max_skew_s) > AGENT_REMEMBERS_S
    cfg = build_config(
        None,
        {"backend": "fake", "listen": "127.0.0.1", "port": 0, "state_dir": tmp_path / "st", "gpus": 2,
         "push_secret_file": write_secret(tmp_path / "secret", SECRET)},
    )  # fmt: skip
    srv = Server(cfg)
    srv.start()
    try:
        assert srv.agent is not None
        now = [1_000_000.0]
        endpoint = ResetEndpoint(srv.agent, SECRET, lambda: now[0], max_skew_s=max_skew_s)
        body = ResetRequest(node=srv.agent.node, gpus=[1], request_id="rst-intent-0001").model_dump_json()

        def send() -> int:  # the executor signs each try afresh, with the same request_id
            headers = signed_headers(SECRET, srv.agent.node, int(now[0]), body.encode())  # type: ignore[union-attr]
            return endpoint.handle(headers, body.encode())[0]

        assert send() == 200
        now[0] += AGENT_REMEMBERS_S  # the executor's last resend of this intent
        assert send() == 409
        kept = json.loads((cfg.state_dir / "control_nonces.json").read_text())
        assert "rst-intent-0001" in kept  # and on disk, so an agent restart refuses it too
        now[0] += reset_id_memory_s(max_skew_s)  # long after: forgotten (the file does not grow forever)
        other = ResetRequest(node=srv.agent.node, gpus=[1], request_id="rst-intent-0002").model_dump_json()
        headers = signed_headers(SECRET, srv.agent.node, int(now[0]), other.encode())
        assert endpoint.handle(headers, other.encode())[0] == 200
        assert "rst-intent-0001" not in json.loads((cfg.state_dir / "control_nonces.json").read_text())
    finally:
        srv.stop()
