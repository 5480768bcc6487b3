"""NVIDIA's Xid catalog as data, and the handling FleetYield derives from it (stdlib only).

Input: ``node_agent/data/xid_catalog.csv`` (NVIDIA's table with its provenance in ``# key: value`` header
lines; another file of the same columns may be given). Output: a ``Catalog`` of ``XidEntry`` rows, and per
XID a ``Handling``: ``drain`` (quarantine the node), ``risk`` (counted by the controller's ``xid_nonfatal``
risk signal, never drains by itself) or ``ignore``.

The derivation is a table from NVIDIA's immediate action (``ACTION_HANDLING``), refined for a few XIDs by
``REFINEMENTS`` (each with its reason). Both the agent (which XIDs are fatal: the pushed ``fatal`` flag and
the Prolog's marker) and the controller (``slurm_fleetyield/xids.py``, which applies the site's overrides
and hands the resulting tuples to the core through ``Params``) read it from here, so they cannot disagree.
Nothing is read at import: ``load_catalog()`` reads the shipped file once, on first use.
"""

from __future__ import annotations

import csv
import functools
import io
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

COLUMNS = ("xid", "mnemonic", "description", "immediate_action", "investigatory_action")
SHIPPED = "xid_catalog.csv"


class Handling(StrEnum):
    DRAIN = "drain"
    RISK = "risk"
    IGNORE = "ignore"


# NVIDIA's immediate action -> what FleetYield does with the XID.
ACTION_HANDLING: Mapping[str, Handling] = {
    # The GPU is not usable for new work until someone resets it, reboots the node or looks at the hardware:
    # exactly what a drain means (the rehabilitation ladder then does the reset/reboot itself).
    "RESET_GPU": Handling.DRAIN,
    "RESTART_BM": Handling.DRAIN,  # reboot the bare-metal node (79 fallen off the bus)
    "WORKFLOW_XID_48": Handling.DRAIN,  # DBE: "a GPU reset or node reboot is needed to clear this error"
    "WORKFLOW_NVLINK_ERR": Handling.DRAIN,  # 74: "a GPU reset or node reboot is needed to clear this error"
    # 144-150 (NVLink5): the catalog's decode sheet makes some subcodes RESET_GPU and others IGNORE; the XID
    # number alone (all NVML reports) cannot tell them apart, so the safe reading is the fatal one.
    "WORKFLOW_NVLINK5_ERR": Handling.DRAIN,
    "CHECK_MECHANICALS": Handling.DRAIN,  # 54 auxiliary power not connected: a human with a screwdriver
    # The recovery action another XID asked for (the message names it): that XID carries the drain; this
    # one is counted.
    "XID_154": Handling.RISK,
    # The application's fault, or the driver's own note that the GPU is fine: nothing to do to the node.
    "RESTART_APP": Handling.IGNORE,
    "IGNORE": Handling.IGNORE,
    "WORKFLOW_XID_45": Handling.IGNORE,  # preemptive cleanup: follows another XID (or a user's Ctrl-C)
    # Every CONTACT_SUPPORT XID but one is "Unused" (never emitted on Ampere and newer); 142 is the video
    # encoder. Contacting support is a human's step, not a reason to take GPUs away.
    "CONTACT_SUPPORT": Handling.IGNORE,
    "UPDATE_SWFW": Handling.IGNORE,  # 78 vGPU start error: the host's software, not the GPU
    "RESTART_VM": Handling.IGNORE,  # 151 confidential-computing key rotation: the guest restarts
    "CHECK_UVM": Handling.IGNORE,  # 159 C2C CHI non-data error: reported by every C2C-connected GPU
    "": Handling.IGNORE,  # the catalog names no action (162-172)
}

REFINEMENTS: Mapping[int, tuple[Handling, str]] = {
    # What the controller's xid_nonfatal risk signal counted before the catalog was data, kept: each one is
    # harmless once, and a GPU that keeps producing it (for different jobs) is a precursor worth a price.
    13: (Handling.RISK, "graphics engine exception: usually the app; repeated on one GPU, suspect"),
    31: (Handling.RISK, "MMU page fault: usually the app; repeated on one GPU, suspect"),
    43: (Handling.RISK, "GPU stopped processing (software-induced): repeated on one GPU, suspect"),
    63: (Handling.RISK, "row remap / page retirement event: contained, precedes 64"),
    92: (Handling.RISK, "high single-bit ECC rate: contained, precedes DBEs"),
    94: (Handling.RISK, "contained ECC error: one app killed, NVIDIA advises a reset when convenient"),
    # Fatal-sounding rows the catalog gives no action for yet: counted rather than ignored.
    167: (Handling.RISK, "PCIe fatal timeout: no catalog action yet"),
    169: (Handling.RISK, "SEC2 micro-controller halt (like 62): no catalog action yet"),
}


class CatalogError(ValueError):
    """The catalog file cannot be used; the message names the file, the line, the field and the value."""


@dataclass(frozen=True, slots=True)
class XidEntry:
    xid: int
    mnemonic: str
    description: str
    immediate_action: str
    investigatory_action: str

    @property
    def name(self) -> str:
        """Human name: NVIDIA's description, or the mnemonic where the description says only 'Unused'."""
        return self.mnemonic if self.description in ("", "Unused") else self.description

    @property
    def handling(self) -> Handling:
        """FleetYield's default handling (``REFINEMENTS`` first, then ``ACTION_HANDLING``)."""
        refined = REFINEMENTS.get(self.xid)
        return refined[0] if refined else ACTION_HANDLING[self.immediate_action]


@dataclass(frozen=True)
class Catalog:
    entries: tuple[XidEntry, ...]
    provenance: Mapping[str, str]  # the header's "# key: value" lines (source, version, retrieved, ...)
    path: str

    def __iter__(self) -> Iterator[XidEntry]:
        return iter(self.entries)

    @functools.cached_property
    def by_xid(self) -> Mapping[int, XidEntry]:
        return {e.xid: e for e in self.entries}

    def get(self, xid: int) -> XidEntry | None:
        return self.by_xid.get(xid)

    def with_handling(self, handling: Handling) -> tuple[int, ...]:
        return tuple(e.xid for e in self.entries if e.handling is handling)


def parse_catalog(text: str, path: str) -> Catalog:
    """Parse the catalog's text (``path`` only names it in errors)."""
    provenance: dict[str, str] = {}
    body: list[str] = []
    key = ""
    for line in text.splitlines():
        if line.startswith("#"):
            content = line[1:].strip()
            head, sep, value = content.partition(":")
            if sep and head and " " not in head and line[1:2] == " " and not line.startswith("#  "):
                key = head
                provenance[key] = value.strip()
            elif key and content:  # an indented continuation of the previous key
                provenance[key] = f"{provenance[key]} {content}".strip()
        else:
            body.append(line)
    reader = csv.DictReader(io.StringIO("\n".join(body)))
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise CatalogError(f"{path}: columns must be {','.join(COLUMNS)}, got {reader.fieldnames!r}")
    entries: list[XidEntry] = []
    seen: set[int] = set()
    for row in reader:
        where = f"{path}: line {reader.line_num + len(text.splitlines()) - len(body)}"
        raw = row["xid"]
        try:
            xid = int(raw)
        except (TypeError, ValueError):
            raise CatalogError(f"{where}: xid must be a positive integer, got {raw!r}") from None
        if xid <= 0 or xid in seen:
            raise CatalogError(f"{where}: xid {raw!r} is {'repeated' if xid in seen else 'not positive'}")
        action = (row["immediate_action"] or "").strip()
        if action not in ACTION_HANDLING:
            raise CatalogError(
                f"{where}: immediate_action {action!r} of XID {xid} is not one FleetYield knows "
                f"({', '.join(repr(a) for a in ACTION_HANDLING)}): give it a handling in ACTION_HANDLING"
            )
        seen.add(xid)
        entries.append(
            XidEntry(
                xid,
                (row["mnemonic"] or "").strip(),
                (row["description"] or "").strip(),
                action,
                (row["investigatory_action"] or "").strip(),
            )
        )
    if not entries:
        raise CatalogError(f"{path}: no XID rows")
    return Catalog(tuple(sorted(entries, key=lambda e: e.xid)), provenance, path)


def read_catalog(path: str | Path) -> Catalog:
    """A catalog file of the shipped format (a site's newer copy of NVIDIA's table)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_catalog(text, str(path))


@functools.cache
def load_catalog() -> Catalog:
    """The catalog shipped in the package (read once, on first use)."""
    # next to this module, not importlib.resources: tests/node_agent shadows the package name on sys.path
    path = Path(__file__).with_name("data") / SHIPPED
    return parse_catalog(path.read_text(encoding="utf-8"), f"node_agent/data/{SHIPPED}")


@functools.cache
def fatal_xids() -> frozenset[int]:
    """The XIDs the agent reports as fatal (pushed ``fatal: true``, kept in the Prolog's marker): the
    catalog's default ``drain`` set. The controller may drain more or fewer (its config's overrides)."""
    return frozenset(load_catalog().with_handling(Handling.DRAIN))


def xid_text(xid: int) -> str:
    """dcgm-exporter's ``err_msg`` for an XID: the catalog's name ("No Error" for 0, else "Unknown Error")."""
    if xid == 0:
        return "No Error"
    entry = load_catalog().get(xid)
    return entry.name if entry is not None else "Unknown Error"
