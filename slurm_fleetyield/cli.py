"""``fleetyield``: run the controller, and read what it decided.

Input: a config file (``--config``; default ``$FLEETYIELD_CONFIG`` or /etc/fleetyield/fleetyield.toml), or
a running controller's API (``--api URL``). Output: the daemon (``run``), or tables / JSON (``status``,
``nodes``, ``explain``, ``events``). The read commands read the store directly, so they work while the
daemon is down; ``--api`` asks a running one instead (e.g. from another host).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import click

from slurm_fleetyield import config as config_mod

DEFAULT_CONFIG = "/etc/fleetyield/fleetyield.toml"


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
            self.store = Store(cfg.store.path, readonly=True)
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
        return {"node": name, "text": entry["explain_text"], "explain": entry["explain"]}

    def events(self, limit: int, node: str | None) -> list[dict[str, Any]]:
        return self.model.events(limit, node)


class ApiSource:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def _get(self, path: str) -> Any:
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")
            with contextlib.suppress(ValueError, KeyError, TypeError):
                detail = json.loads(detail)["error"]
            raise click.ClickException(f"{self.url}{path}: HTTP {err.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as err:
            raise click.ClickException(f"{self.url}{path}: {err}") from None

    def status(self) -> dict[str, Any]:
        return self._get("/v1/status")

    def rows(self) -> list[dict[str, Any]]:
        return self._get("/v1/nodes")

    def node(self, name: str) -> dict[str, Any]:
        return self._get(f"/v1/nodes/{urllib.parse.quote(name, safe='')}/explain")

    def events(self, limit: int, node: str | None) -> list[dict[str, Any]]:
        query = {"limit": limit, **({"node": node} if node else {})}
        return self._get("/v1/events?" + urllib.parse.urlencode(query))


def _source(config_path: str | None, api: str | None) -> StoreSource | ApiSource:
    if api:
        return ApiSource(api)
    return StoreSource(_load(config_path or os.environ.get("FLEETYIELD_CONFIG", DEFAULT_CONFIG)))


def _emit_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, sort_keys=True))


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
_api_option = click.option("--api", help="Ask a running controller instead, e.g. http://ctl:9401.")
_json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


# --------------------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------------------


class _FleetYieldGroup(click.Group):
    """Mounts ``fleetyield simulate`` lazily: the simulator's imports (~70 ms) must not slow every command."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), "simulate"])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "simulate":
            from slurm_fleetyield.sim.cli import simulate

            return simulate
        return super().get_command(ctx, cmd_name)


@click.group(cls=_FleetYieldGroup)
def main() -> None:
    """FleetYield for Slurm: per-GPU risk turned into node features, weights and drains."""


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Read and decide, never change Slurm (the plan is logged).")
@click.option("--once", is_flag=True, help="Run one tick, print its summary and exit.")
@click.option("--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--log-format", default="json", type=click.Choice(["json", "text"]))
def run(config_path: str, dry_run: bool, once: bool, log_level: str, log_format: str) -> None:
    """Run the controller (until SIGTERM/SIGINT, or one tick with --once)."""
    from slurm_fleetyield.daemon import build, serve, setup_logging

    cfg = _load(config_path)
    setup_logging(log_level, json_lines=log_format == "json")
    try:
        runtime = build(cfg, dry_run=dry_run or None)
    except (config_mod.ConfigError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    outcome = serve(runtime, once=once)
    if outcome is not None:
        plan = outcome.result.plan
        click.echo(
            f"tick {outcome.tick}: slurm_ok={outcome.slurm_ok} nodes={len(outcome.result.nodes)} "
            f"actions={len(plan.actions)} holds={len(plan.holds)} slurm_calls={outcome.report.calls} "
            f"failed={len(outcome.report.failed)}"
        )
        if outcome.report.failed:
            sys.exit(1)


@main.command()
@_config_option
@_api_option
@_json_option
def status(config_path: str | None, api: str | None, as_json: bool) -> None:
    """Fleet summary and table: node, tier, risk, features, weight, Slurm state, reason."""
    source = _source(config_path, api)
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
    for hold in doc["plan"]["holds"]:
        click.echo(f"HOLD {hold['node']} {hold['action']} ({hold['rule']}): {hold['detail']}")
    for failed in doc["apply"]["failed"]:
        click.echo(f"FAILED {' '.join(failed['command'])}: {failed['detail']}")
    click.echo(_table(rows))


@main.command()
@_config_option
@_api_option
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
@_json_option
def explain(node: str, config_path: str | None, api: str | None, as_json: bool) -> None:
    """Why NODE is where it is: tier, risk, every signal's contribution, evidence."""
    doc = _source(config_path, api).node(node)
    if as_json:
        _emit_json(doc["explain"])
    else:
        click.echo(doc["text"])


@main.command()
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--node", help="Only this node's events.")
@_config_option
@_api_option
@_json_option
def events(limit: int, node: str | None, config_path: str | None, api: str | None, as_json: bool) -> None:
    """The event log (tier changes, drains, holds, applied commands), newest first."""
    rows = _source(config_path, api).events(limit, node)
    if as_json:
        _emit_json(rows)
        return
    for r in rows:
        click.echo(f"{r['time']:.3f} tick={r['tick']} {r['kind']:<16} {r['node'] or '-':<12} {r['message']}")


@main.command("validate-config")
@click.argument("path", type=click.Path(dir_okay=False))
@_json_option
def validate_config(path: str, as_json: bool) -> None:
    """Check a config file; print the effective configuration (defaults applied) with --json."""
    cfg = _load(path)
    if as_json:
        _emit_json(cfg.model_dump(mode="json"))
    else:
        click.echo(f"{path}: ok")


@main.command("example-config")
def example_config() -> None:
    """Print every option with its description and default (contrib/fleetyield.example.toml)."""
    click.echo(config_mod.example_toml(), nl=False)


if __name__ == "__main__":  # pragma: no cover
    main()
