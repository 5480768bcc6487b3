"""The docker cluster's compose files give every container a fixed address on the cluster network.

Why: slurmctld resolves a node's ``NodeAddr`` once and keeps the address. With addresses from docker's pool,
a node container that came back from ``scontrol reboot`` (the compose restart policy) after another container
had taken its old address swapped addresses with it; slurmctld then sent each node's RPCs to the other (slurmd
"bad node index (-1 > 1)", jobs stuck COMPLETING, the HA test's approved drain never seen in Slurm).

Input: contrib/slurm-docker-cluster/docker-compose.yml and docker-compose.ha.yml, with ``FLEETYIELD_NET`` at
its default. Output: pass/fail.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

import yaml

CLUSTER = Path(__file__).parents[1] / "contrib" / "slurm-docker-cluster"
_VAR = re.compile(r"\$\{FLEETYIELD_NET:-([0-9.]+)\}")


def _load(name: str) -> dict[str, Any]:
    text = _VAR.sub(r"\1", (CLUSTER / name).read_text())
    return yaml.safe_load(text)


def _addresses() -> dict[str, ipaddress.IPv4Address]:
    out: dict[str, ipaddress.IPv4Address] = {}
    for name in ("docker-compose.yml", "docker-compose.ha.yml"):
        for svc, spec in _load(name)["services"].items():
            nets = spec.get("networks")
            if nets is None:
                continue  # an override of a service defined in the base file (environment, command)
            assert isinstance(nets, dict), f"{name}: services.{svc}.networks = {nets!r}: no fixed address"
            addr = (nets.get("cluster") or {}).get("ipv4_address")
            assert addr, f"{name}: services.{svc}.networks.cluster has no ipv4_address"
            out[svc] = ipaddress.IPv4Address(addr)
    return out


def test_every_container_has_its_own_fixed_address_outside_the_dynamic_range() -> None:
    (pool,) = _load("docker-compose.yml")["networks"]["cluster"]["ipam"]["config"]
    subnet = ipaddress.IPv4Network(pool["subnet"])
    dynamic = ipaddress.IPv4Network(pool["ip_range"])
    gateway = ipaddress.IPv4Address(pool["gateway"])
    addrs = _addresses()
    base = _load("docker-compose.yml")["services"]
    assert set(base) <= set(addrs), set(base) - set(addrs)
    assert "fleetyield-b" in addrs  # the HA standby too
    assert len(set(addrs.values())) == len(addrs), addrs
    for svc, a in addrs.items():
        assert a in subnet and a not in dynamic and a != gateway, (svc, a, subnet, dynamic, gateway)
    assert gateway in subnet and dynamic.subnet_of(subnet)
