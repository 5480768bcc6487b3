"""``fleetyield simulate``: a click group the lead mounts on the main CLI (``cli.add_command(simulate)``).

Input: command-line options (each maps to a ``SimConfig`` / ``FaultParams`` field). Output: ``report.json``,
``report.txt`` and PNGs in ``--out``; the text table on stdout (``--json``: the report, as in report.json;
errors as ``{"error": ...}`` on stderr). ``simulate run`` compares every policy on the same seeds;
``simulate sweep`` repeats it over precursor observability shares (default 0, 0.1, 0.25, 0.5).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from node_agent.clikit import JsonErrorGroup, emit, json_option
from slurm_fleetyield.sim import report, runner
from slurm_fleetyield.sim.traces import TraceError


def _common(f):  # type: ignore[no-untyped-def]
    opts = [
        click.option(
            "--nodes", type=int, default=None, help="Fleet size (8-GPU nodes) [default: 64; frontier: 2048]."
        ),
        click.option("--days", default=30.0, show_default=True, help="Simulated horizon in days."),
        click.option("--seeds", default=10, show_default=True, help="Number of seeds (>= 10 for the CIs)."),
        click.option("--first-seed", default=0, show_default=True),
        click.option(
            "--workload",
            default="openb",
            show_default=True,
            help="openb | synthetic | frontier (one gang over 15/16 of the fleet for the whole horizon, "
            "small jobs beside it) | path to a generic CSV/JSON or sacct --parsable2 trace.",
        ),
        click.option("--load", default=0.7, show_default=True, help="Offered GPU-hours / fleet GPU-hours."),
        click.option(
            "--premium-share",
            type=float,
            default=None,
            help="Share of H100 nodes [default: 0.5; frontier: 1].",
        ),
        click.option(
            "--node-rate",
            "node_rate_per_1000_node_days",
            default=3.79,
            show_default=True,
            help="Interruptions per 1,000 node-days (Llama 3: 3.79; Meta RSC: 2.34-6.50).",
        ),
        click.option("--lead-h", default=24.0, show_default=True, help="Mean precursor lead time (h)."),
        click.option(
            "--false-alarm-ratio",
            default=1.0,
            show_default=True,
            help="Benign precursor-like episodes per true precursor (assumption).",
        ),
        click.option(
            "--control-interval",
            "control_interval_s",
            default=900.0,
            show_default=True,
            help="Seconds between controller ticks (plus one per fatal push).",
        ),
        click.option(
            "--tick-mode",
            default="event",
            show_default=True,
            type=click.Choice(["event", "plain"]),
            help="event: a controller tick on a control-interval grid point only where something the core "
            "reads changed since its last tick or its wake_at is due; plain: on every grid point (same plans "
            "and reports).",
        ),
        click.option(
            "--post-return",
            default="none",
            show_default=True,
            type=click.Choice(["none", "titan", "titan-floor"]),
            help="Hazard of a repaired GPU: none (as new; only lemons fail more) or Titan's post-return fit.",
        ),
        click.option("--human-delay-h", default=4.0, show_default=True, help="Drain proposal -> approval."),
        click.option("--repair-h", default=24.0, show_default=True),
        click.option(
            "--collective-timeout",
            "collective_timeout_s",
            default=600.0,
            show_default=True,
            help="Seconds a job of more than one GPU hangs on a dead GPU before it fails (PyTorch's NCCL "
            "process-group timeout, 10 min by default).",
        ),
        click.option(
            "--health-check-interval",
            "health_check_interval_s",
            default=300.0,
            show_default=True,
            help="Slurm HealthCheckInterval: NHC drains a node with a dead GPU at its next run.",
        ),
        click.option(
            "--restart-s",
            "restart_s",
            default=300.0,
            show_default=True,
            help="Seconds each restart of an interrupted job spends before progress (scheduling, "
            "initialisation, checkpoint load; assumption, sweep it).",
        ),
        click.option(
            "--service-loss",
            default="inflight",
            show_default=True,
            type=click.Choice(["inflight", "run"]),
            help="What an interrupted decode (inference) service loses: the requests in flight and its "
            "restart (it keeps what it served), or its whole run (the earlier assumption).",
        ),
        click.option("--swap-h", default=24.0, show_default=True),
        click.option(
            "--background-load",
            default=0.5,
            show_default=True,
            help="Frontier: the background jobs' share of the GPU-hours the gang leaves (contention).",
        ),
        click.option(
            "--policies",
            default=None,
            help=f"Comma-separated [default: {','.join(runner.POLICIES)}; "
            "frontier: baseline,fleetyield,oracle].",
        ),
        click.option("--workers", default=1, show_default=True, help="Processes (one seed each)."),
        click.option("--out", "out_dir", default="sim-out", show_default=True, type=click.Path()),
        click.option("--no-plots", is_flag=True, help="Skip the PNGs (no matplotlib needed)."),
        click.option(
            "--params",
            "params_file",
            default=None,
            type=click.Path(exists=True, dir_okay=False),
            help="TOML file of decision-core overrides for the FleetYield policies (a [core] table, as in "
            "the controller's config file).",
        ),
        json_option("Print the report as JSON instead of the table (errors as JSON on stderr)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@click.group("simulate", cls=JsonErrorGroup)
def simulate() -> None:
    """Trace-scale simulation: baseline vs FleetYield vs oracle on identical seeds (SIMULATED results)."""


def _split(kw: dict) -> tuple[dict, dict]:
    keys = ("seeds", "first_seed", "workers", "out_dir", "no_plots", "policies", "as_json")
    run = {k: kw.pop(k) for k in keys}
    if run["policies"] is None:  # a 2,048-node frontier run of every ablation would take hours
        frontier_default = ("baseline", "fleetyield", "oracle")
        run["policies"] = ",".join(frontier_default if kw.get("workload") == "frontier" else runner.POLICIES)
    run["policies"] = tuple(p.strip() for p in run["policies"].split(",") if p.strip())
    path = kw.pop("params_file", None)
    if path:
        kw["core"] = _core_overrides(path)
    frontier = kw.get("workload") == "frontier"
    if kw.get("nodes") is None:
        kw["nodes"] = 2048 if frontier else 64
    if kw.get("premium_share") is None:
        kw["premium_share"] = 1.0 if frontier else 0.5
    return run, kw


def _core_overrides(path: str) -> str:
    """The [core] table of ``path`` as JSON (SimConfig.core), validated by the controller's own loader
    (``config.load``: errors name the file, the field and the value)."""
    import tomllib

    from slurm_fleetyield.config import ConfigError, load

    try:
        load(path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    if set(doc) - {"core"}:
        raise click.ClickException(f"{path}: expected only a [core] table, got {sorted(doc)}")
    return json.dumps(doc.get("core", {}), sort_keys=True)


@simulate.command("run")
@_common
@click.option(
    "--precursor-share", default=0.25, show_default=True, help="Share of fatal faults with a precursor."
)
def run_cmd(**kw: object) -> None:
    """Run every policy over the seeds and write the report."""
    r, cfg = _split(dict(kw))
    try:
        rep = runner.main_simulate(
            r["out_dir"], r["seeds"], r["first_seed"], r["policies"], r["workers"], not r["no_plots"], **cfg
        )
    except (TraceError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if r["as_json"]:
        emit(rep)
    else:
        click.echo(report.table(rep), nl=False)


@simulate.command("sweep")
@_common
@click.option("--shares", default="0,0.1,0.25,0.5", show_default=True, help="Precursor shares to sweep.")
def sweep_cmd(shares: str, **kw: object) -> None:
    """Repeat the comparison for each precursor observability share."""
    r, cfg = _split(dict(kw))
    try:
        rows = runner.main_sweep(
            r["out_dir"],
            [float(x) for x in shares.split(",")],
            r["seeds"],
            r["first_seed"],
            r["policies"],
            r["workers"],
            not r["no_plots"],
            **cfg,
        )
    except (TraceError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    text = report.sweep_table(rows)
    Path(r["out_dir"]).mkdir(parents=True, exist_ok=True)
    (Path(r["out_dir"]) / "sweep.txt").write_text(text)
    doc = {f"{s:g}": rep["policies"] for s, rep in rows}
    (Path(r["out_dir"]) / "sweep.json").write_text(json.dumps(doc, sort_keys=True, indent=1) + "\n")
    if r["as_json"]:
        emit(doc)
    else:
        click.echo(text, nl=False)
