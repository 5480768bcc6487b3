"""``fleetyield``: run the controller, and read what it decided.

Input: a config file (``--config``; default ``$FLEETYIELD_CONFIG`` or /etc/fleetyield/fleetyield.toml), or
a running controller's API (``--api URL`` or ``$FLEETYIELD_API``). Output: the daemon (``run``), or tables /
JSON (``status``, ``nodes``, ``explain``, ``events``, ``ledger``, ``pending``). The read commands read the
store directly, so they work while the daemon is down; ``--api`` asks a running one instead (e.g. from
another host). With none of these, they ask the demo cluster's API published on this host (``make up``).
``--json`` on a command prints JSON, and its errors as ``{"error": ...}`` on stderr (node_agent.clikit).
``xids`` lists NVIDIA's Xid catalog with the handling the config gives each XID (``--json``: xid, name,
catalog_action, handling).

The human gate: ``keygen NAME`` makes an admin key pair; ``pending`` lists open drain proposals;
``approve ID --key K`` / ``deny ID --key K`` sign a decision and submit it to the controller's listener
(``POST /v1/approvals`` on the push port), or write it with ``--out FILE`` for ``submit-approval FILE``
elsewhere; ``audit verify`` checks the gate's hash-chained audit log. Exit status: 0 done, 1 refused
(the listener's rejection code is printed), 2 usage or unreachable.

A listener served with a web-config file (TLS, basic auth) is asked with ``--ca-file``, ``--cert-file``/
``--key-file``, ``--basic-auth-user`` and ``--password-file`` (or ``$FLEETYIELD_CA_FILE`` ...; ``clientauth``)
on every command that asks one; ``--config`` reaches the push listener over https when its web-config
serves TLS.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import click

from node_agent.clikit import JsonErrorGroup, emit, json_option, version_option
from node_agent.httpclient import ClientConfigError, HttpClient
from node_agent.httpclient import urlopen as client_urlopen
from slurm_fleetyield import clientauth
from slurm_fleetyield import config as config_mod
from slurm_fleetyield.clientauth import client_options

DEFAULT_CONFIG = "/etc/fleetyield/fleetyield.toml"
API_ENV = "FLEETYIELD_API"
CONFIG_ENV = "FLEETYIELD_CONFIG"
# The docker demo cluster publishes the controller's API on the host's loopback
# (contrib/slurm-docker-cluster/docker-compose.yml): the last place the read commands look.
DEMO_API = "http://127.0.0.1:9401"


def _load(path: str) -> config_mod.Config:
    try:
        return config_mod.load(path)
    except config_mod.ConfigError as exc:
        raise click.ClickException(str(exc)) from None


# --------------------------------------------------------------------------------------------------------
# Where the read commands get their data
# --------------------------------------------------------------------------------------------------------


class StoreSource:
    def __init__(self, cfg: config_mod.Config) -> None:
        from slurm_fleetyield.adapters.api import StoreReadModel
        from slurm_fleetyield.adapters.store import Store, StoreError

        try:
            self.store = Store(cfg.store.target, readonly=True)
        except StoreError as exc:
            raise click.ClickException(str(exc)) from None
        self.model = StoreReadModel(self.store)

    def status(self) -> dict[str, Any]:
        return self.model.status()

    def rows(self) -> list[dict[str, Any]]:
        from slurm_fleetyield.adapters.views import node_rows

        return node_rows(self.model.result())

    def node(self, name: str) -> dict[str, Any]:
        entry = ((self.model.result() or {}).get("nodes") or {}).get(name)
        if entry is None:
            raise click.ClickException(f"node {name!r} is not in the last committed tick")
        found = self.model.explanation(name)
        if found is None:  # after a restart explanations are stored over a few ticks (views.py)
            raise click.ClickException(
                f"node {name!r}: no stored explanation yet (the daemon stores them over its first ticks); "
                "ask the daemon with --api"
            )
        return {"node": name, "text": found[1], "explain": found[0]}

    def events(self, limit: int, node: str | None) -> list[dict[str, Any]]:
        return self.model.events(limit, node)

    def ledger(self, by: str, since: float | None) -> dict[str, Any]:
        from slurm_fleetyield.adapters.views import aggregate_ledger

        return {"by": by, "since": since, "groups": aggregate_ledger(self.store.ledger(since=since), by)}

    def calibration(self) -> dict[str, Any]:
        view = self.model.result() or {}
        return {"tick": view.get("tick"), **(view.get("calibration") or {})}


class ApiSource:
    def __init__(self, url: str, looked: str = "", client: HttpClient | None = None) -> None:
        self.url = url.rstrip("/")
        self.looked = looked  # how the URL was found, said when it cannot be reached
        self.client = client  # credentials for an API served with a web-config file (clientauth)

    def _get(self, path: str) -> Any:
        try:
            with client_urlopen(urllib.request.Request(self.url + path), 30, self.client) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")
            with contextlib.suppress(ValueError, KeyError, TypeError):
                detail = json.loads(detail)["error"]
            hint = clientauth.refusal_hint(err.code, self.client)
            raise click.ClickException(f"{self.url}{path}: HTTP {err.code}: {detail}{hint}") from None
        except ClientConfigError as err:  # the password file became unreadable
            raise click.ClickException(str(err)) from None
        except (urllib.error.URLError, OSError) as err:
            hint = f" ({self.looked})" if self.looked else ""
            reason = clientauth.describe_failure(getattr(err, "reason", err))
            raise click.ClickException(f"{self.url}{path}: {reason}{hint}") from None

    def status(self) -> dict[str, Any]:
        return self._get("/v1/status")

    def rows(self) -> list[dict[str, Any]]:
        return self._get("/v1/nodes")

    def node(self, name: str) -> dict[str, Any]:
        return self._get(f"/v1/nodes/{urllib.parse.quote(name, safe='')}/explain")

    def events(self, limit: int, node: str | None) -> list[dict[str, Any]]:
        query = {"limit": limit, **({"node": node} if node else {})}
        return self._get("/v1/events?" + urllib.parse.urlencode(query))

    def ledger(self, by: str, since: float | None) -> dict[str, Any]:
        query = {"by": by, **({"since": since} if since is not None else {})}
        return self._get("/v1/ledger?" + urllib.parse.urlencode(query))

    def calibration(self) -> dict[str, Any]:
        return self._get("/v1/calibration")


def _find_controller(config_path: str | None, api: str | None) -> tuple[str, str] | config_mod.Config:
    """Where the read commands ask: ``--api``; ``--config``; ``$FLEETYIELD_API``; ``$FLEETYIELD_CONFIG``, else
    /etc/fleetyield/fleetyield.toml when it exists; else the demo cluster's API on this host. A URL comes
    back with how it was found (said in the error when it cannot be reached), a config file as ``Config``."""
    if api:
        return api, ""
    if config_path:
        return _load(config_path)
    env_api = os.environ.get(API_ENV, "").strip()
    if env_api:
        return env_api, f"from ${API_ENV}"
    env_config = os.environ.get(CONFIG_ENV, "").strip()
    if env_config:
        return _load(env_config)
    if os.path.exists(DEFAULT_CONFIG):
        return _load(DEFAULT_CONFIG)
    return DEMO_API, (
        f"looked for the controller: no --api, no --config, ${API_ENV} and ${CONFIG_ENV} unset, no "
        f"{DEFAULT_CONFIG}; then the demo cluster's published API {DEMO_API}. Say where: --api URL, "
        f"${API_ENV}=URL or --config FILE"
    )


def _source(config_path: str | None, api: str | None) -> StoreSource | ApiSource:
    found = _find_controller(config_path, api)
    if isinstance(found, config_mod.Config):
        return StoreSource(found)
    return ApiSource(*found, client=clientauth.client())


_emit_json = emit


def _table(rows: list[dict[str, Any]]) -> str:
    headers = ("NODE", "TIER", "RISK", "FEATURES", "WEIGHT", "SLURM", "REASON")
    body = [
        (
            r["node"],
            r["tier"],
            "-" if r.get("risk") is None else f"{r['risk']:.3f}",
            ",".join(r.get("features") or []) or "-",
            str(r.get("weight", "")),
            r.get("slurm_state") or "-",
            (r.get("reason") or "")[:70],
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in body]
    return "\n".join(lines)


_config_option = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), help="Config file (reads the store)."
)
_api_option = click.option(
    "--api",
    help=f"Ask a running controller instead, e.g. http://ctl:9401 (default: ${API_ENV}; with neither "
    f"--config nor ${CONFIG_ENV} nor {DEFAULT_CONFIG}, the demo cluster's {DEMO_API}).",
)
_json_option = json_option()


# --------------------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------------------


class _FleetYieldGroup(JsonErrorGroup):
    """Mounts ``fleetyield simulate``, ``chaos``, ``doctor`` and ``attest`` lazily: their imports must not
    slow every command."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), "simulate", "doctor", "attest", "chaos"])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "simulate":
            from slurm_fleetyield.sim.cli import simulate

            return simulate
        if cmd_name == "chaos":
            from slurm_fleetyield.chaos.cli import chaos

            return chaos
        if cmd_name == "doctor":
            from slurm_fleetyield.doctor import doctor_command

            return doctor_command()
        if cmd_name == "attest":  # cryptography and sqlite are imported only by this command
            from slurm_fleetyield.attest.cli import attest

            return attest
        return super().get_command(ctx, cmd_name)


@click.group(cls=_FleetYieldGroup)
@version_option()
def main() -> None:
    """FleetYield for Slurm: per-GPU risk turned into node features, weights and drains."""


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Read and decide, never change Slurm (the plan is logged).")
@click.option("--once", is_flag=True, help="Run one tick, print its summary and exit.")
@click.option("--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--log-format", default="json", type=click.Choice(["json", "text"]))
@json_option("With --once: the tick's summary as JSON.")
def run(config_path: str, dry_run: bool, once: bool, log_level: str, log_format: str, as_json: bool) -> None:
    """Run the controller (until SIGTERM/SIGINT, or one tick with --once)."""
    from slurm_fleetyield.adapters.store import StoreError
    from slurm_fleetyield.daemon import build, serve, setup_logging
    from slurm_fleetyield.gate.errors import GateError

    cfg = _load(config_path)
    setup_logging(log_level, json_lines=log_format == "json")
    try:
        runtime = build(cfg, dry_run=dry_run or None)
    except (config_mod.ConfigError, StoreError, GateError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    outcome = serve(runtime, once=once)
    if outcome is not None:
        plan = outcome.result.plan
        summary = {
            "tick": outcome.tick,
            "slurm_ok": outcome.slurm_ok,
            "nodes": len(outcome.result.nodes),
            "actions": len(plan.actions),
            "holds": len(plan.holds),
            "slurm_calls": outcome.report.calls,
            "failed": len(outcome.report.failed),
        }
        if as_json:
            _emit_json(summary)
        else:
            fields = " ".join(f"{k}={v}" for k, v in summary.items() if k != "tick")
            click.echo(f"tick {outcome.tick}: {fields}")
        if outcome.report.failed:
            sys.exit(1)


def _calibration_text(doc: dict[str, Any]) -> str:
    brier = doc.get("brier")
    lines = [
        f"calibration (tick {doc.get('tick')}): Brier "
        f"{'-' if brier is None else f'{brier:.4f}'} over {doc.get('resolved', 0)} resolved predictions, "
        f"{doc.get('open_predictions', 0)} open",
        "P(FAIL) BIN          PREDICTED  OBSERVED  COUNT",
    ]
    for b in doc.get("bins") or []:
        pm, of = b.get("predicted_mean"), b.get("observed_frequency")
        lines.append(
            f"[{b['lower']:.4f}, {b['upper']:.4f})  {'-' if pm is None else f'{pm:9.4f}'}  "
            f"{'-' if of is None else f'{of:8.4f}'}  {b['count']:5d}"
        )
    multipliers = doc.get("multipliers") or {}
    if multipliers:
        lines.append("learned multipliers: " + ", ".join(f"{k}={v:.3g}" for k, v in multipliers.items()))
    return "\n".join(lines)


@main.command()
@_config_option
@_api_option
@client_options
@_json_option
@click.option("--calibration", is_flag=True, help="The risk model's reliability table, Brier, multipliers.")
def status(config_path: str | None, api: str | None, as_json: bool, calibration: bool) -> None:
    """Fleet summary and table: node, tier, risk, features, weight, Slurm state, reason."""
    source = _source(config_path, api)
    if calibration:
        doc = source.calibration()
        if as_json:
            _emit_json(doc)
        else:
            click.echo(_calibration_text(doc))
        return
    doc, rows = source.status(), source.rows()
    if as_json:
        _emit_json({**doc, "nodes": rows})
        return
    if "tick" not in doc:
        click.echo("no tick committed yet")
        return
    summary = doc["summary"]
    tiers = " ".join(f"{k}={v}" for k, v in summary["tiers"].items())
    dry = " DRY-RUN" if doc["dry_run"] else ""
    click.echo(
        f"tick {doc['tick']} ({doc['time']:.0f}, {doc['duration_s']:.2f}s){dry}: "
        f"{summary['nodes']} nodes [{tiers}], {summary['actions']} actions, {summary['holds']} holds, "
        f"{summary['scrape_errors']} scrape errors, inbox pending {doc['inbox']['pending']}"
    )
    leader = doc.get("leader") or {}
    if leader.get("mode") == "lease":
        who = leader["leader"] or "none (lease lapsed: a standby takes over)"
        click.echo(f"leader: {who} (token {leader['token']}, lease {leader['expires_in_s']}s left)")
    for hold in doc["plan"]["holds"]:
        click.echo(f"HOLD {hold['node']} {hold['action']} ({hold['rule']}): {hold['detail']}")
    for b in (doc.get("stake") or {}).get("breaker", ()):
        click.echo(f"BREAKER {b['feature']} ({b['class']}): {b['message']}")
    for failed in doc["apply"]["failed"]:
        click.echo(f"FAILED {' '.join(failed['command'])}: {failed['detail']}")
    click.echo(_table(rows))


@main.command()
@_config_option
@_api_option
@client_options
@_json_option
def nodes(config_path: str | None, api: str | None, as_json: bool) -> None:
    """The fleet table only."""
    rows = _source(config_path, api).rows()
    if as_json:
        _emit_json(rows)
    else:
        click.echo(_table(rows))


@main.command()
@click.argument("node")
@_config_option
@_api_option
@client_options
@_json_option
def explain(node: str, config_path: str | None, api: str | None, as_json: bool) -> None:
    """Why NODE is where it is: tier, risk, the stake arithmetic, every signal's contribution, evidence;
    and drain_pays' figures of its last drain proposal (from the proposal's log event)."""
    source = _source(config_path, api)
    doc = source.node(node)
    drain = _drain_stake(source.events(1000, node), doc["explain"])
    if as_json:
        _emit_json({**doc["explain"], **({"drain_stake": drain} if drain else {})})
    else:
        click.echo(doc["text"])
        if drain:
            click.echo(_drain_stake_text(drain))


def _drain_stake(events: list[dict[str, Any]], explained: dict[str, Any]) -> dict[str, Any] | None:
    """drain_pays' figures of the node's open drain proposal, else of its latest one (the gate logs them in
    the ``drain_proposal`` event's data: ``stake`` in words, ``stake_figures`` the numbers). None: no
    proposal made under the stake rule in the events kept."""
    made = [e for e in events if e.get("kind") == "drain_proposal" and (e.get("data") or {}).get("stake")]
    if not made:
        return None
    open_id = (explained.get("proposal") or {}).get("id")
    e = next((e for e in made if e["data"].get("proposal_id") == open_id), made[0])  # newest first
    d = e["data"]
    return {
        "proposal_id": d.get("proposal_id"),
        "time": e.get("time"),
        "open": d.get("proposal_id") == open_id,
        "why": d["stake"],
        "figures": d.get("stake_figures"),
    }


def _drain_stake_text(x: dict[str, Any]) -> str:
    state = "open" if x["open"] else "no longer open"
    head = f"drain proposal {x['proposal_id']} ({state}), made at {x['time']:.0f} because it pays: "
    f = x["figures"]
    if not f:  # logged before the figures were
        return head + x["why"]
    risk = f.get("risk")
    at = f" (risk {risk:.3f}, at most stake.drain_precision)" if risk is not None and risk != f["p"] else ""
    return head + (
        f"averted = p {f['p']:.3f}{at} x (requeued work {f['moved_gpu_h']:.1f} + next stake "
        f"{f['next_gpu_h']:.1f} + repair downtime {f['repair_gpu_h']:.1f}) = {f['averted_gpu_h']:.1f} GPU-h "
        f"vs cost = drain downtime {f['drain_gpu_h']:.1f} + requeued work {f['moved_gpu_h']:.1f} = "
        f"{f['cost_gpu_h']:.1f} GPU-h"
    )


@main.command()
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--node", help="Only this node's events.")
@_config_option
@_api_option
@client_options
@_json_option
def events(limit: int, node: str | None, config_path: str | None, api: str | None, as_json: bool) -> None:
    """The event log (tier changes, drains, holds, applied commands), newest first."""
    rows = _source(config_path, api).events(limit, node)
    if as_json:
        _emit_json(rows)
        return
    for r in rows:
        click.echo(f"{r['time']:.3f} tick={r['tick']} {r['kind']:<16} {r['node'] or '-':<12} {r['message']}")


@main.command()
@click.option(
    "--by",
    default="all",
    show_default=True,
    type=click.Choice(["all", "class", "node", "tier", "day", "cause"]),
    help="Group settled jobs by workload class, node (split evenly), tier at start, UTC day or cause.",
)
@click.option("--since", type=float, help="Only jobs that ended at or after this Unix time.")
@click.option("--since-hours", type=float, help="Only jobs that ended in the last N hours.")
@_config_option
@_api_option
@client_options
@_json_option
def ledger(
    by: str,
    since: float | None,
    since_hours: float | None,
    config_path: str | None,
    api: str | None,
    as_json: bool,
) -> None:
    """Goodput ledger: useful, wasted and net (useful - wasted) GPU-hours, failures, premium misuse."""
    import time as _time

    if since_hours is not None:
        since = _time.time() - since_hours * 3600.0
    doc = _source(config_path, api).ledger(by, since)
    if as_json:
        _emit_json(doc)
        return
    headers = (
        "GROUP",
        "JOBS",
        "FAILURES",
        "USEFUL_GPU_H",
        "WASTED_GPU_H",
        "NET_GPU_H",
        "PREMIUM_MISUSE_GPU_H",
    )
    keys = (
        "group",
        "jobs",
        "failures",
        "useful_gpu_h",
        "wasted_gpu_h",
        "net_goodput_gpu_h",
        "premium_misuse_gpu_h",
    )
    body = [tuple(f"{g[k]:g}" if isinstance(g[k], float) else str(g[k]) for k in keys) for g in doc["groups"]]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for r in body:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    if not body:
        click.echo("(no settled jobs)")


# --------------------------------------------------------------------------------------------------------
# The human gate
# --------------------------------------------------------------------------------------------------------


def _gate_cfg(config_path: str | None) -> config_mod.Config:
    return _load(config_path or os.environ.get(CONFIG_ENV, DEFAULT_CONFIG))


def _proposals(
    config_path: str | None, api: str | None, proposal_id: str | None = None
) -> list[dict[str, Any]]:
    found = _find_controller(config_path, api)
    if not isinstance(found, config_mod.Config):
        src = ApiSource(*found, client=clientauth.client())
        if proposal_id is not None:
            return [src._get(f"/v1/proposals/{urllib.parse.quote(proposal_id, safe='')}")]
        return src._get("/v1/proposals")["pending"]
    from slurm_fleetyield.adapters.proposals import ProposalsUnavailable, read_proposals

    cfg = found
    try:
        if proposal_id is not None:
            return read_proposals(cfg.gate_dir, proposal_id=proposal_id, url=cfg.gate_url)
        return read_proposals(cfg.gate_dir, status="pending", url=cfg.gate_url)
    except ProposalsUnavailable as exc:
        raise click.ClickException(str(exc)) from None


@main.command()
@click.argument("name")
@click.option(
    "--dir",
    "out_dir",
    default=os.path.join("~", ".fleetyield"),
    show_default=True,
    help="Where NAME.key (0600) and NAME.pub are written.",
)
@_json_option
def keygen(name: str, out_dir: str, as_json: bool) -> None:
    """Create an admin's Ed25519 key pair (NAME.key, NAME.pub) and print NAME.pub's line.

    Nothing else is changed: to authorize the admin, append that line to the file the controller's
    gate.authorized_keys names (on the controller host; it is re-read at every approval)."""
    from slurm_fleetyield.gate import GateError
    from slurm_fleetyield.gate import keygen as make_keys

    try:
        private, public = make_keys(name, os.path.expanduser(out_dir))
    except (GateError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    line = public.read_text().strip()
    if as_json:
        _emit_json({"private_key": str(private), "public_key": str(public), "authorized_keys_line": line})
        return
    click.echo(f"private key: {private} (keep it; mode 0600)")
    click.echo(f"public key:  {public}")
    click.echo("add this line to the controller's gate.authorized_keys file:")
    click.echo(line)


@main.command()
@_config_option
@_api_option
@client_options
@_json_option
def pending(config_path: str | None, api: str | None, as_json: bool) -> None:
    """Open drain proposals: node, GPUs, risk, affected jobs, expiry, evidence."""
    import time as _time

    rows = _proposals(config_path, api)
    if as_json:
        _emit_json(rows)
        return
    if not rows:
        click.echo("no open proposals")
        return
    now = _time.time()
    for p in rows:
        left = p["expires_at"] - now
        click.echo(
            f"{p['id']}  node {p['node']}  gpus {p['gpus'] or 'all'}  risk {p['risk']:.3f}  "
            f"jobs {p['affected_jobs'] or '-'}  expires in {max(0.0, left) / 3600:.1f} h"
        )
        for line in str(p["evidence"]).splitlines()[:40]:
            click.echo(f"    {line}")
        click.echo(
            f"  approve: fleetyield approve {p['id']} --key ADMIN.key"
            f"   deny: fleetyield deny {p['id']} --key ADMIN.key"
        )


def _submit_url(cfg: config_mod.Config | None, url: str | None) -> str:
    if url:
        return url.rstrip("/") + ("" if url.rstrip("/").endswith("/v1/approvals") else "/v1/approvals")
    if cfg is None:
        raise click.UsageError("say where to submit: --submit URL (the controller's push listener)")
    host = cfg.push.host if cfg.push.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
    return f"{clientauth.scheme(cfg.push.web_config_file)}://{host}:{cfg.push.port}/v1/approvals"


def submit_envelope(url: str, envelope: str, client: HttpClient | None = None) -> tuple[int, dict[str, Any]]:
    """POST an envelope to the controller's listener, with ``client``'s credentials when it is served with a
    web-config file; (HTTP status, JSON answer)."""
    req = urllib.request.Request(
        url, data=envelope.encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with client_urlopen(req, 30, client) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        body = err.read()
        try:
            return err.code, json.loads(body)
        except ValueError:
            message = body.decode(errors="replace")[:500] + clientauth.refusal_hint(err.code, client).strip()
            return err.code, {"error": "http_error", "message": message}
    except ClientConfigError as err:  # the password file became unreadable
        raise click.ClickException(str(err)) from None
    except (urllib.error.URLError, OSError) as err:
        raise click.ClickException(
            f"{url}: {clientauth.describe_failure(getattr(err, 'reason', err))}"
        ) from None


def _report_submission(status_code: int, doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _emit_json({"http_status": status_code, **doc})
    elif status_code == 200:
        click.echo(
            f"{doc['proposal_id']} ({doc['node']}): {doc['status']} by {doc['admin']}, "
            f"audit seq {doc['audit_seq']}"
        )
    else:
        click.echo(f"refused ({status_code}): {doc.get('error')}: {doc.get('message', '')}", err=True)
    if status_code != 200:
        sys.exit(1)


def _decide(
    action: str,
    proposal_id: str,
    key: str,
    note: str,
    ttl: int,
    out: str | None,
    submit: str | None,
    config_path: str | None,
    api: str | None,
    as_json: bool,
) -> None:
    from slurm_fleetyield.gate import GateError, sign_statement
    from slurm_fleetyield.gate.proposal import PROPOSAL_ID_RE

    if not PROPOSAL_ID_RE.fullmatch(proposal_id):
        raise click.BadParameter(f"{proposal_id!r} is not a proposal id (p-<12 hex>)", param_hint="ID")
    found = _proposals(config_path, api, proposal_id)
    if not found:
        raise click.ClickException(f"no proposal {proposal_id}")
    proposal = found[0]
    if proposal["status"] != "pending":
        raise click.ClickException(f"proposal {proposal_id} is already {proposal['status']}")

    class _Ref:
        id = proposal["id"]
        node = proposal["node"]

    try:
        envelope = sign_statement(key, _Ref(), action, ttl_s=ttl, note=note)
    except (GateError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if out:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(envelope + "\n")
        if as_json:
            _emit_json({"envelope_file": out, "proposal_id": proposal_id, "action": action})
        else:
            click.echo(f"signed {action} of {proposal_id} ({proposal['node']}) written to {out}")
        return
    cfg = None if submit else _gate_cfg(config_path)
    status_code, doc = submit_envelope(_submit_url(cfg, submit), envelope, clientauth.client())
    _report_submission(status_code, doc, as_json)


def _decision_command(action: str):  # type: ignore[no-untyped-def]
    @click.argument("proposal_id", metavar="ID")
    @click.option(
        "--key", required=True, type=click.Path(dir_okay=False), help="Your private key (NAME.key)."
    )
    @click.option("--note", default="", help="Free text kept in the audit log (<= 500 chars).")
    @click.option(
        "--ttl",
        default=900,
        show_default=True,
        type=click.IntRange(1, 86_400),
        help="Seconds the signed decision stays valid.",
    )
    @click.option(
        "--out", type=click.Path(dir_okay=False), help="Write the envelope here instead of submitting."
    )
    @click.option("--submit", "submit", help="Listener URL (default: from the config's [push] host/port).")
    @_config_option
    @_api_option
    @client_options
    @_json_option
    def command(
        proposal_id: str,
        key: str,
        note: str,
        ttl: int,
        out: str | None,
        submit: str | None,
        config_path: str | None,
        api: str | None,
        as_json: bool,
    ) -> None:
        _decide(action, proposal_id, key, note, ttl, out, submit, config_path, api, as_json)

    command.__doc__ = (
        f"Sign '{action}' for proposal ID and submit it (or write it with --out). The proposal is read from "
        "the gate (--config) or a running controller (--api)."
    )
    return command


main.command("approve")(_decision_command("approve"))
main.command("deny")(_decision_command("deny"))


def _read_text(path: str, what: str) -> str:
    """A file's text, or a ClickException naming the file (unreadable, not UTF-8)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise click.ClickException(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise click.ClickException(
            f"{path}: {what} is not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})"
        ) from None


@main.command("submit-approval")
@click.argument("envelope_file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--submit", "submit", help="Listener URL (default: from the config's [push] host/port).")
@_config_option
@client_options
@_json_option
def submit_approval(envelope_file: str, submit: str | None, config_path: str | None, as_json: bool) -> None:
    """Submit an envelope written by ``approve/deny --out`` to the controller's listener."""
    if envelope_file == "-":
        envelope = click.get_text_stream("stdin").read().strip()
    else:
        envelope = _read_text(envelope_file, "the envelope").strip()
    cfg = None if submit else _gate_cfg(config_path)
    status_code, doc = submit_envelope(_submit_url(cfg, submit), envelope, clientauth.client())
    _report_submission(status_code, doc, as_json)


@main.group()
def audit() -> None:
    """The gate's hash-chained audit log."""


@audit.command("verify")
@click.option(
    "--jsonl",
    type=click.Path(dir_okay=False),
    help="Verify an exported JSONL file instead of the database.",
)
@click.option(
    "--head",
    "head_path",
    type=click.Path(dir_okay=False),
    help="Head checkpoint (audit.head) to verify against.",
)
@_config_option
@_json_option
def audit_verify(jsonl: str | None, head_path: str | None, config_path: str | None, as_json: bool) -> None:
    """Check the audit chain (and its head checkpoint); exit 1 and print the first bad seq on any problem."""
    import sqlite3

    from slurm_fleetyield.gate import GateError, Gatekeeper, read_head, verify_jsonl

    db = None
    try:
        head = read_head(head_path) if head_path else None
        if jsonl is not None:
            report = verify_jsonl(_read_text(jsonl, "the audit export").splitlines(), head)
        else:
            cfg = _gate_cfg(config_path)
            db = Path(cfg.gate_dir) / "gate.db"
            if cfg.gate_url is None and not db.exists():
                raise click.ClickException(f"{cfg.gate_dir}: no gate database")
            with Gatekeeper.open(cfg.gate_dir, url=cfg.gate_url) as gk:
                report = gk.audit.verify(head)
    except GateError as exc:
        raise click.ClickException(str(exc)) from None
    except sqlite3.DatabaseError as exc:  # damaged past what the chain check reads: pages, header
        raise click.ClickException(
            f"{db}: the gate database is damaged ({exc}); restore it from backup"
        ) from None
    if as_json:
        _emit_json(report.model_dump())
    elif report.ok:
        click.echo(f"ok: {report.entries} entries, head seq {report.last_seq} {report.last_hash}")
    else:
        click.echo(f"BAD at seq {report.first_bad_seq} ({report.code}): {report.problem}", err=True)
    if not report.ok:
        sys.exit(1)


@main.command("validate-config")
@click.argument("path", type=click.Path(dir_okay=False))
@_json_option
def validate_config(path: str, as_json: bool) -> None:
    """Check a config file and open every file it names as ``run`` does (secrets, the listeners' web-config
    files, client certificates, tokens; authorized_keys: a warning); print the effective configuration
    (defaults applied) with --json."""
    from slurm_fleetyield.daemon import check_files

    cfg = _load(path)
    errors, warnings = check_files(cfg)
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    if errors:
        raise click.ClickException("\n".join(str(e) for e in errors))
    if as_json:
        _emit_json(cfg.model_dump(mode="json"))
    else:
        click.echo(f"{path}: ok")


@main.command("xids")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="Config file whose [xids] and core.quarantine apply (default: $FLEETYIELD_CONFIG, else "
    f"{DEFAULT_CONFIG} if present, else the catalog alone).",
)
@_json_option
def xids(config_path: str | None, as_json: bool) -> None:
    """Every XID: NVIDIA's name and immediate action, and what FleetYield does (drain / risk / ignore)."""
    from slurm_fleetyield.xids import catalog_at, resolve

    path = config_path or os.environ.get("FLEETYIELD_CONFIG")
    if path is None and os.path.exists(DEFAULT_CONFIG):
        path = DEFAULT_CONFIG
    cfg = _load(path) if path else config_mod.Config()
    q = cfg.core.quarantine
    resolved = resolve(catalog_at(cfg.xids.catalog), None, q.quarantine_xids, q.risk_only_xids)
    if as_json:
        click.echo(json.dumps([r.as_json() for r in resolved.rows], indent=2))
        return
    prov = resolved.catalog.provenance
    click.echo(f"# catalog: {resolved.catalog.path} (source: {prov.get('source', '?').split(' ')[0]})")
    click.echo(f"# config: {path or '(none: the catalog defaults)'}")
    headers = ("XID", "NAME", "CATALOG ACTION", "HANDLING")
    body = [(str(r.xid), r.name[:60], r.catalog_action or "(none)", r.handling.value) for r in resolved.rows]
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(headers)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for row in body:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


@main.command("example-config")
@json_option("The defaults as JSON (what validate-config --json prints for an empty file).")
def example_config(as_json: bool) -> None:
    """Print every option with its description and default (contrib/fleetyield.example.toml)."""
    if as_json:
        _emit_json(config_mod.from_mapping({}, "<defaults>").model_dump(mode="json"))
    else:
        click.echo(config_mod.example_toml(), nl=False)


if __name__ == "__main__":  # pragma: no cover
    main()
