from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from node_agent.fatal import read_pending, write_pending


def test_missing_file_means_nothing_pending(tmp_path: Path) -> None:
    assert read_pending(tmp_path) == []


def test_roundtrip(tmp_path: Path) -> None:
    entry = {
        "event_id": "e",
        "time": 1.0,
        "gpu": 2,
        "uuid": "GPU-x",
        "kind": "xid",
        "xid": 79,
        "reset_fixes": True,
        "message": "m",
    }
    write_pending(tmp_path, "n1", [entry], now=5.0)
    assert read_pending(tmp_path) == [entry]
    doc = json.loads((tmp_path / "fatal.json").read_text())
    assert doc["version"] == 1 and doc["node"] == "n1" and doc["updated"] == 5.0


def test_corrupt_file_fails_safe(tmp_path: Path) -> None:
    (tmp_path / "fatal.json").write_text("{oops")
    pending = read_pending(tmp_path)
    assert [p["kind"] for p in pending] == ["marker_unreadable"]


def test_reader_imports_nothing_heavy(tmp_path: Path) -> None:
    code = (
        "import sys; from node_agent.fatal import read_pending; read_pending(sys.argv[1]); "
        "heavy = [m for m in ('pydantic', 'prometheus_client', 'psutil', 'pynvml', 'click', 'cryptography') "
        "if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
