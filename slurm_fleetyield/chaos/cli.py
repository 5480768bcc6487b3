"""``fleetyield chaos``: seeded chaos timelines against the docker cluster, replay, and the A/B driver.

``timeline SEED`` prints the plan (no cluster needed); ``run`` executes one timeline and logs it;
``replay LOG`` re-executes the timeline recorded in a log's header; ``ab --seeds 0,1,2`` runs bare Slurm and
Slurm + FleetYield on the same timelines and prints the side-by-side ledger (``make ab``).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from slurm_fleetyield.chaos import ab as ab_mod
from slurm_fleetyield.chaos import log as log_mod
from slurm_fleetyield.chaos.runner import docker_exec
from slurm_fleetyield.chaos.timeline import TimelineParams, generate


def _params(duration: float, jobs: int, faults: int, implants: int) -> TimelineParams:
    return TimelineParams(duration_s=duration, jobs=jobs, faults=faults, implants=implants)


def _opts(f):  # type: ignore[no-untyped-def]
    for o in reversed(
        [
            click.option("--duration", default=1800.0, show_default=True, help="Seconds of timeline."),
            click.option("--jobs", default=24, show_default=True),
            click.option("--faults", default=3, show_default=True, help="GPU faults injected (simulated)."),
            click.option("--implants", default=0, show_default=True),
            click.option("--out", "out_dir", default="chaos-out", show_default=True, type=click.Path()),
        ]
    ):
        f = o(f)
    return f


@click.group("chaos")
def chaos() -> None:
    """Seeded, replayable chaos against the docker cluster (faults SIMULATED by the agents' fake backend)."""


@chaos.command("timeline")
@click.argument("seed", type=int)
@_opts
def timeline_cmd(seed: int, duration: float, jobs: int, faults: int, implants: int, out_dir: str) -> None:
    """Print the timeline a seed gives (nothing is executed)."""
    click.echo(json.dumps(generate(seed, _params(duration, jobs, faults, implants)).to_dict(), indent=1))


@chaos.command("run")
@click.option("--seed", type=int, required=True)
@click.option("--arm", type=click.Choice(ab_mod.ARMS), default="fleetyield", show_default=True)
@_opts
def run_cmd(
    seed: int, arm: str, duration: float, jobs: int, faults: int, implants: int, out_dir: str
) -> None:
    """Run one timeline on the cluster in one arm; log to OUT/chaos-<arm>-s<seed>.jsonl."""
    tl = generate(seed, _params(duration, jobs, faults, implants))
    res = ab_mod.run_arm(tl, arm, docker_exec, Path(out_dir))
    click.echo(json.dumps(res["totals"], sort_keys=True, indent=1))


@chaos.command("replay")
@click.argument("log_path", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_dir", default="chaos-replay", show_default=True, type=click.Path())
def replay_cmd(log_path: str, out_dir: str) -> None:
    """Re-execute the timeline (and arm) recorded in LOG's header."""
    try:
        tl, recs = log_mod.read(log_path)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    arm = next(r for r in recs if r.get("type") == "header").get("arm", "fleetyield")
    res = ab_mod.run_arm(tl, arm, docker_exec, Path(out_dir))
    click.echo(json.dumps(res["totals"], sort_keys=True, indent=1))


@chaos.command("ab")
@click.option("--seeds", default="0,1,2", show_default=True, help="Comma-separated seeds.")
@click.option("--drain-timeout", default=1800.0, show_default=True, help="Max wait for jobs after a run.")
@_opts
def ab_cmd(
    seeds: str, drain_timeout: float, duration: float, jobs: int, faults: int, implants: int, out_dir: str
) -> None:
    """Bare Slurm vs Slurm + FleetYield on the same timelines; writes OUT/ab.json and the logs."""
    ss = [int(s) for s in seeds.split(",") if s.strip()]
    tp = _params(duration, jobs, faults, implants)
    summary = ab_mod.ab(ss, docker_exec, Path(out_dir), tp, drain_timeout_s=drain_timeout)
    click.echo(summary["table"], nl=False)
