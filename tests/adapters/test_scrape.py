"""AgentScraper: real expositions (stock dcgm-exporter, our agent) and real HTTP failures on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from slurm_fleetyield.adapters.scrape import AgentScraper, ScrapeError, parse_exposition

FIXTURES = Path(__file__).parent / "fixtures"
DCGM = (FIXTURES / "dcgm_exporter_3.3.5_h100.txt").read_text()
AGENT = (FIXTURES / "agent_fake_h100_2gpu_xid48.txt").read_text()


def test_stock_dcgm_exporter_output():
    sample = parse_exposition(DCGM, "gpu-07", 100.0)
    assert sample.error is None and sample.source == "dcgm-exporter" and sample.expected_gpus is None
    g0, g1 = sample.gpus
    assert (g0.index, g0.uuid, g0.model, g0.pci_bus_id) == (
        0,
        "GPU-927d7444-b45a-7c49-8402-5e686e46a026",
        "NVIDIA H100 80GB HBM3",
        "00000000:18:00.0",
    )
    assert g0.fields["DCGM_FI_DEV_SM_CLOCK"] == 345
    # counters keep their DCGM names (the parser's "_total" suffix is removed)
    assert g1.fields["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 59102233911
    assert g1.fields["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == 3
    assert "DCGM_FI_DEV_MEMORY_TEMP" not in g1.fields  # DCGM blank sentinel: no value, not 9.2e18 C
    assert g1.xid_totals == {31: 2} and g0.xid_totals == {}  # windowed count, zero series without xid skipped


def test_agent_output_prefers_the_monotonic_counter():
    sample = parse_exposition(AGENT, "gpu-01", 5.0)
    assert sample.source == "agent" and sample.expected_gpus == 2 and len(sample.gpus) == 2
    assert sample.gpus[1].xid_totals == {48: 1} and sample.gpus[0].xid_totals == {}
    assert sample.gpus[0].fields["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == 0


def test_agent_lowercase_hostname_label_and_check():
    text = AGENT.replace('Hostname="gpu-01"', 'hostname="gpu-01"')
    assert parse_exposition(text, "GPU-01.cluster.local", 0, expect_hostname="GPU-01.cluster.local").gpus
    with pytest.raises(ScrapeError, match="hostname mismatch"):
        parse_exposition(text, "gpu-02", 0, expect_hostname="gpu-02")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('DCGM_FI_DEV_GPU_TEMP{gpu="0" 5\n', "malformed exposition"),
        ('DCGM_FI_DEV_GPU_TEMP{gpu="x",UUID="GPU-1"} 5\n', "gpu='x'"),
        ('DCGM_FI_DEV_GPU_TEMP{gpu="0"} not-a-number\n', "malformed exposition"),
    ],
)
def test_malformed_exposition_is_a_clear_error(text, message):
    with pytest.raises(ScrapeError, match=message):
        parse_exposition(text, "n", 0)


# ------------------------------------------------------------------------------------------------------
# over HTTP
# ------------------------------------------------------------------------------------------------------


class _Server:
    """Serves /metrics per node name from a dict; node "hang" blocks until released (no sleeps)."""

    def __init__(self, bodies: dict[str, tuple[int, str]]):
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                node = self.path.strip("/").split("/")[0]
                if node == "hang":
                    outer.release.wait(10)
                    return
                status, body = bodies.get(node, (404, "no such node"))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    srv = _Server(
        {
            "gpu-01": (200, AGENT),
            "gpu-07": (200, DCGM),
            "broken": (200, 'DCGM_FI_DEV_GPU_TEMP{gpu="0" 5\n'),
            "err": (500, "boom"),
        }
    )
    yield srv
    srv.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sample_many_nodes_with_every_kind_of_failure(server):
    scraper = AgentScraper(url_template=f"http://127.0.0.1:{server.port}/{{node}}/metrics", timeout_s=0.5)
    try:
        samples = scraper.sample(["gpu-01", "gpu-07", "broken", "err", "hang"], 42.0)
    finally:
        scraper.close()
    assert samples["gpu-01"].error is None and samples["gpu-01"].time == 42.0
    assert samples["gpu-07"].source == "dcgm-exporter" and len(samples["gpu-07"].gpus) == 2
    assert samples["broken"].error.startswith("malformed exposition") and samples["broken"].gpus == ()
    assert samples["err"].error == "HTTP 500 Internal Server Error"
    assert samples["hang"].error == "timed out"


def test_connection_refused_is_a_sample_error():
    scraper = AgentScraper(url_template=f"http://127.0.0.1:{_closed_port()}/{{node}}", timeout_s=1.0)
    try:
        sample = scraper.sample(["gpu-09"], 1.0)["gpu-09"]
    finally:
        scraper.close()
    assert sample.error.startswith("connection failed") and sample.node == "gpu-09"


def test_injected_fetch_seam():
    calls = []

    def fetch(url, timeout_s):
        calls.append((url, timeout_s))
        return AGENT.encode()

    scraper = AgentScraper(url_template="http://{node}:9400/metrics", timeout_s=2.5, fetch=fetch)
    assert scraper.sample(["gpu-01"], 0)["gpu-01"].expected_gpus == 2
    assert calls == [("http://gpu-01:9400/metrics", 2.5)]
    scraper.close()


def test_real_h200_agent_exposition_matches_dcgm_exporters_layout():
    """Captured from the nvml backend on a real H200: parsed like a dcgm-exporter scrape, with the same
    label names in the same order and the same pci_bus_id form, so series join with dcgm-exporter's."""
    real = (FIXTURES / "agent_nvml_h200_real.txt").read_text()
    sample = parse_exposition(real, "vm", 10.0, expect_hostname="vm")
    assert sample.source == "agent" and sample.expected_gpus == 1
    (g,) = sample.gpus
    assert (g.index, g.uuid, g.model, g.pci_bus_id) == (
        0,
        "GPU-235d247a-6f02-b0d7-2711-5675cff2c3d4",
        "NVIDIA H200",
        "00000000:00:06.0",
    )
    assert g.fields["DCGM_FI_DEV_FB_TOTAL"] == 143771
    assert g.fields["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] > 0
    assert not any("NVLINK" in name for name in g.fields)  # NotSupported here: omitted, not zero
    assert g.xid_totals == {}

    def label_names(text: str) -> list[str]:
        line = next(x for x in text.splitlines() if x.startswith("DCGM_FI_DEV_SM_CLOCK{"))
        return [pair.split("=", 1)[0] for pair in line[line.index("{") + 1 : line.index("}")].split('",')]

    assert label_names(real) == label_names(DCGM)
