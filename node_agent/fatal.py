"""Pending fatal events marker: ``STATE_DIR/fatal.json`` (stdlib only, fast to import).

Input: fatal events raised by the agent (the XIDs ``node_agent.xid_catalog.fatal_xids()`` names,
"GPU missing" and failed checks). Output: a JSON file the Slurm prolog reads to refuse jobs on a node whose
GPUs have fatal events not yet cleared by a GPU reset.

File format (written atomically: temp file + rename; absent file == nothing pending)::

    {
      "version": 1,
      "node": "gpu-node-01",
      "updated": 1718000000.25,          # unix seconds of the last write
      "pending": [
        {
          "event_id": "5f0c...",          # uuid4, same id as the pushed AgentEvent
          "time": 1718000000.2,           # unix seconds the event happened
          "gpu": 3,                       # GPU index, or null for node-wide events
          "uuid": "GPU-....",             # GPU UUID or null
          "kind": "xid",                  # "xid" | "gpu_missing"
          "xid": 79,                      # XID number or null
          "reset_fixes": true,            # whether a GPU reset clears it
          "message": "XID 79: GPU has fallen off the bus"
        }
      ]
    }

A GPU reset removes the entries of that GPU whose ``reset_fixes`` is true; entries with
``reset_fixes: false`` (e.g. XID 64, row-remap failure) stay until an operator clears
them (``fleetyield-agent fault clear --gpu N --all``). ``read_pending(state_dir)`` never
raises on a missing file; a corrupt file is reported as one synthetic pending entry of
kind ``"marker_unreadable"`` so callers can tell "corrupt" from "clear". The Slurm Prolog logs it and
lets the job through: an unreadable marker is missing data, not evidence of a fault, and FleetYield never
takes a destructive step (a Prolog failure drains the node) on missing data.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

FATAL_FILE = "fatal.json"
FORMAT_VERSION = 1


def read_pending(state_dir: str | os.PathLike[str]) -> list[dict]:
    """Return the pending fatal events of ``state_dir`` (empty list when none)."""
    path = Path(state_dir) / FATAL_FILE
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [_unreadable(f"cannot read {path}: {exc}")]
    try:
        doc = json.loads(raw)
        pending = doc["pending"]
        if not isinstance(pending, list) or not all(isinstance(p, dict) for p in pending):
            raise ValueError("'pending' is not a list of objects")
    except (ValueError, KeyError, TypeError) as exc:
        return [_unreadable(f"corrupt {path}: {exc}")]
    return pending


def write_pending(state_dir: str | os.PathLike[str], node: str, pending: Iterable[dict], now: float) -> None:
    """Atomically write the marker file with ``pending`` entries."""
    directory = Path(state_dir)
    directory.mkdir(parents=True, exist_ok=True)
    doc = {"version": FORMAT_VERSION, "node": node, "updated": now, "pending": list(pending)}
    fd, tmp = tempfile.mkstemp(prefix=".fatal.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, directory / FATAL_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _unreadable(message: str) -> dict:
    return {
        "event_id": "marker-unreadable",
        "time": None,
        "gpu": None,
        "uuid": None,
        "kind": "marker_unreadable",
        "xid": None,
        "reset_fixes": False,
        "message": message,
    }
