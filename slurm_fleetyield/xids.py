"""The controller's XID handling: NVIDIA's catalog, the site's config on top, the tuples the core receives.

Input: the catalog (``node_agent/xid_catalog.py``: the shipped file or a site's copy), the ``[xids]``
overrides and any explicit ``core.quarantine.quarantine_xids`` / ``risk_only_xids`` lists of the config.
Output: ``Resolved``: per XID its catalog action and FleetYield's handling (``drain`` / ``risk`` /
``ignore``) with where that came from, and the two tuples ``core.params.QuarantineParams`` takes. The core
never reads the file: ``config.py`` fills the tuples in before validating ``Params``.

Precedence, weakest first: the catalog's derived handling; an explicit list of the config (the XIDs it names
get its handling; a given ``quarantine_xids`` or ``risk_only_xids`` replaces that whole class of the
catalog, so configs written before the catalog keep their meaning); ``[xids] overrides`` (per XID).
An XID outside the catalog is ``ignore`` unless a list or an override names it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from node_agent.xid_catalog import Catalog, Handling, load_catalog, read_catalog


@dataclass(frozen=True, slots=True)
class XidRow:
    xid: int
    name: str
    catalog_action: str  # NVIDIA's immediate action ("" none named; "-" not in the catalog)
    handling: Handling

    def as_json(self) -> dict[str, object]:
        return {
            "xid": self.xid,
            "name": self.name,
            "catalog_action": self.catalog_action,
            "handling": self.handling.value,
        }


@dataclass(frozen=True, slots=True)
class Resolved:
    rows: tuple[XidRow, ...]  # by XID
    catalog: Catalog

    def xids(self, handling: Handling) -> tuple[int, ...]:
        return tuple(r.xid for r in self.rows if r.handling is handling)

    @property
    def quarantine_xids(self) -> tuple[int, ...]:
        return self.xids(Handling.DRAIN)

    @property
    def risk_only_xids(self) -> tuple[int, ...]:
        return self.xids(Handling.RISK)

    def handling(self, xid: int) -> Handling:
        for r in self.rows:
            if r.xid == xid:
                return r.handling
        return Handling.IGNORE


def catalog_at(path: str | None) -> Catalog:
    """The site's catalog file, or the shipped one."""
    return load_catalog() if path is None else read_catalog(path)


def resolve(
    catalog: Catalog,
    overrides: Mapping[int, Handling] | None = None,
    quarantine_xids: Iterable[int] | None = None,
    risk_only_xids: Iterable[int] | None = None,
) -> Resolved:
    """Every XID's handling (see the module doc for the precedence)."""
    handling: dict[int, Handling] = {}
    for e in catalog:
        h = e.handling
        if (h is Handling.DRAIN and quarantine_xids is not None) or (
            h is Handling.RISK and risk_only_xids is not None
        ):
            h = Handling.IGNORE  # the config's list replaces this class of the catalog
        handling[e.xid] = h
    for given, h in ((quarantine_xids, Handling.DRAIN), (risk_only_xids, Handling.RISK)):
        for x in given or ():
            handling[int(x)] = h
    for x, h in (overrides or {}).items():
        handling[int(x)] = Handling(h)
    rows = []
    for x in sorted(handling):
        entry = catalog.get(x)
        name = entry.name if entry is not None else "(not in the catalog)"
        action = entry.immediate_action if entry is not None else "-"
        rows.append(XidRow(x, name, action, handling[x]))
    return Resolved(tuple(rows), catalog)
