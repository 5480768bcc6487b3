"""Where the public data sets live (``shared/data`` beside the checkout; see its README for sources).

Input: the environment. Output: paths. ``FLEETYIELD_DATA_DIR`` overrides; otherwise ``../shared/data``
relative to the repository root, which is where a checkout and CI find it.
"""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    env = os.environ.get("FLEETYIELD_DATA_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def openb_pods() -> Path:
    return data_dir() / "alibaba-gpu-v2023" / "openb_pod_list_default.csv"


def titan_csv() -> Path:
    return data_dir() / "titan-gpu-lifetimes" / "gc_full.csv"
