"""``fleetyield chaos``: seeded chaos timelines against the docker cluster, replay, and the A/B driver.

``timeline SEED`` prints the plan (no cluster needed); ``run`` executes one timeline and logs it; ``replay
LOG`` re-executes the timeline recorded in a log's header; ``ab --seeds 0,1,2`` runs bare Slurm and Slurm +
FleetYield on the same timelines and prints the side-by-side ledger (``make ab``); ``report AB_JSON`` renders
its Markdown table (``--readme``: into README.md); ``ab-gang`` runs one 3-node gang and one fatal GPU fault
per seed in both arms (``make ab-gang``; ``report`` renders its ab-gang.json into its own block). ``--duration
D`` scales the default 1,800 s profile (job work, checkpoint intervals) to a D-second run
(``TimelineParams.for_duration``). ``run``, ``replay``, ``ab`` and ``ab-gang`` leave the cluster as ``make
up`` does (controller on, fresh state, every node green). ``--json`` on any verb prints JSON (``ab``: the
summary written to ab.json; ``report``: the Markdown in a document) and errors as ``{"error": ...}`` on
stderr.
"""

from __future__ import annotations

import functools
import json
import shlex
import sys
from pathlib import Path

import click

from node_agent.clikit import JsonErrorGroup, emit, json_option
from slurm_fleetyield.chaos import ab as ab_mod
from slurm_fleetyield.chaos import gang, gang_ab, gang_report
from slurm_fleetyield.chaos import log as log_mod
from slurm_fleetyield.chaos import report as report_mod
from slurm_fleetyield.chaos.runner import docker_exec
from slurm_fleetyield.chaos.timeline import Timeline, TimelineParams, generate


def _params(
    duration: float, jobs: int, faults: int, implants: int, precursors: float = 0.0
) -> TimelineParams:
    if duration <= 0 or jobs < 0 or faults < 0 or implants < 0 or not 0.0 <= precursors <= 1.0:
        raise click.BadParameter(
            f"--duration must be > 0, counts >= 0 and --precursor-share within [0, 1] (got "
            f"duration={duration}, jobs={jobs}, faults={faults}, implants={implants}, "
            f"precursor-share={precursors})"
        )
    return TimelineParams.for_duration(
        duration, jobs=jobs, faults=faults, implants=implants, precursor_share=precursors
    )


def _run_restoring(tl: Timeline, arm: str, out_dir: str) -> dict:  # type: ignore[type-arg]
    try:
        return ab_mod.run_arm(tl, arm, docker_exec, Path(out_dir))
    except ab_mod.ChaosError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        ab_mod.Cluster(docker_exec, tl.params.nodes).restore()


def _opts(f):  # type: ignore[no-untyped-def]
    """The timeline options (and ``--out``); the command receives them as ``tp`` (``TimelineParams``, checked
    by ``_params``) and ``out_dir``."""

    @functools.wraps(f)
    def with_params(*args, duration, jobs, faults, implants, precursors, **kw):  # type: ignore[no-untyped-def]
        return f(*args, tp=_params(duration, jobs, faults, implants, precursors), **kw)

    for o in reversed(
        [
            click.option(
                "--duration",
                default=1800.0,
                show_default=True,
                help="Seconds of timeline; job work and checkpoints scale with it (1800: work 120-600 s).",
            ),
            click.option("--jobs", default=24, show_default=True),
            click.option("--faults", default=3, show_default=True, help="GPU faults injected (simulated)."),
            click.option("--implants", default=0, show_default=True),
            click.option(
                "--precursor-share",
                "precursors",
                default=0.0,
                show_default=True,
                help="Share of the faults preceded by a visible ECC precursor (simulated; 0: all sudden).",
            ),
            click.option("--out", "out_dir", default="chaos-out", show_default=True, type=click.Path()),
        ]
    ):
        with_params = o(with_params)
    return with_params


# timeline, run and replay print JSON in any case; --json is taken for uniformity (and JSON errors)
JSON = json_option()


@click.group("chaos", cls=JsonErrorGroup)
def chaos() -> None:
    """Seeded, replayable chaos against the docker cluster (faults SIMULATED by the agents' fake backend)."""


@chaos.command("timeline")
@click.argument("seed", type=int)
@_opts
@JSON
def timeline_cmd(seed: int, tp: TimelineParams, out_dir: str, as_json: bool) -> None:
    """Print the timeline a seed gives (nothing is executed)."""
    click.echo(json.dumps(generate(seed, tp).to_dict(), indent=1))


@chaos.command("run")
@click.option("--seed", type=int, required=True)
@click.option("--arm", type=click.Choice(ab_mod.ARMS), default="fleetyield", show_default=True)
@_opts
@JSON
def run_cmd(seed: int, arm: str, tp: TimelineParams, out_dir: str, as_json: bool) -> None:
    """Run one timeline on the cluster in one arm; log to OUT/chaos-<arm>-s<seed>.jsonl."""
    res = _run_restoring(generate(seed, tp), arm, out_dir)
    click.echo(json.dumps(res["totals"], sort_keys=True, indent=1))


@chaos.command("replay")
@click.argument("log_path", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_dir", default="chaos-replay", show_default=True, type=click.Path())
@JSON
def replay_cmd(log_path: str, out_dir: str, as_json: bool) -> None:
    """Re-execute the timeline (and arm) recorded in LOG's header."""
    try:
        tl, recs = log_mod.read(log_path)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    arm = next(r for r in recs if r.get("type") == "header").get("arm", "fleetyield")
    res = _run_restoring(tl, arm, out_dir)
    click.echo(json.dumps(res["totals"], sort_keys=True, indent=1))


@chaos.command("ab")
@click.option("--seeds", default="0,1,2", show_default=True, help="Comma-separated seeds.")
@click.option(
    "--drain-timeout",
    type=float,
    default=None,
    help="Max wait for a run's jobs after its last event, then they are cancelled [default: --duration].",
)
@click.option(
    "--admin-delay",
    type=click.FloatRange(min=0),
    default=None,
    help="An emulated admin approves each drain proposal of the FleetYield arm this many seconds after it "
    "appears, through the real gate (signed; chaos/admin.py) [default: no admin].",
)
@_opts
@JSON
def ab_cmd(
    seeds: str,
    drain_timeout: float | None,
    admin_delay: float | None,
    tp: TimelineParams,
    out_dir: str,
    as_json: bool,
) -> None:
    """Bare Slurm vs Slurm + FleetYield on the same timelines; writes OUT/ab.json and the logs."""
    try:
        ss = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise click.BadParameter(f"--seeds must be comma-separated integers, got {seeds!r}") from None
    if not ss:
        raise click.BadParameter("--seeds names no seed")
    argv = sys.argv[1:]
    command = shlex.join(["fleetyield", *argv]) if argv[:2] == ["chaos", "ab"] else ""
    try:
        summary = ab_mod.ab(
            ss,
            docker_exec,
            Path(out_dir),
            tp,
            drain_timeout_s=drain_timeout,
            command=command,
            admin_delay_s=admin_delay,
        )
    except ab_mod.ChaosError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        emit(summary)
    else:
        click.echo(summary["table"], nl=False)


@chaos.command("ab-gang")
@click.option("--seeds", default="0,1,2", show_default=True, help="Comma-separated seeds.")
@click.option("--work", "work_s", type=click.FloatRange(min=1), default=120.0, show_default=True,
              help="Seconds of the gang's work.")  # fmt: skip
@click.option("--ckpt", "ckpt_s", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Checkpoint every this many seconds of work (0: never).")  # fmt: skip
@click.option("--collective-timeout", "collective_s", type=click.FloatRange(min=1), default=60.0,
              show_default=True,
              help="Hang before a gang on a dead GPU fails (simulator's 600 s x 0.1).")  # fmt: skip
@click.option("--health-check-interval", "hc_s", type=click.FloatRange(min=1), default=30.0,
              show_default=True, help="NHC's period (the simulator's 300 s x 0.1), both arms.")  # fmt: skip
@click.option("--out", "out_dir", default="docs/ab-gang", show_default=True, type=click.Path())
@click.option(
    "--resettle",
    is_flag=True,
    help="Run nothing: rebuild OUT/ab-gang.json's results from OUT's logs (after a ledger change).",
)
@JSON
def ab_gang_cmd(
    seeds: str,
    work_s: float,
    ckpt_s: float,
    collective_s: float,
    hc_s: float,
    out_dir: str,
    resettle: bool,
    as_json: bool,
) -> None:
    """A 3-node gang and one fatal GPU fault per seed, bare Slurm vs Slurm + FleetYield; writes
    OUT/ab-gang.json and the logs (time from the fault to the gang running again, progress lost)."""
    if resettle:
        try:
            summary = gang_ab.resettle(Path(out_dir))
        except (OSError, ValueError, KeyError, StopIteration) as exc:
            raise click.ClickException(f"{out_dir}: cannot resettle ({exc!r})") from None
        if as_json:
            emit(summary)
        else:
            click.echo(gang_ab.describe(summary), nl=False)
        return
    try:
        ss = [int(s) for s in seeds.split(",") if s.strip()]
        gp = gang.GangParams(
            work_s=work_s, ckpt_s=ckpt_s, collective_timeout_s=collective_s, health_check_interval_s=hc_s
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if not ss:
        raise click.BadParameter("--seeds names no seed")
    argv = sys.argv[1:]
    command = shlex.join(["fleetyield", *argv]) if argv[:2] == ["chaos", "ab-gang"] else ""
    try:
        summary = gang_ab.ab_gang(ss, docker_exec, Path(out_dir), gp, command=command)
    except ab_mod.ChaosError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        emit(summary)
    else:
        click.echo(gang_ab.describe(summary), nl=False)


@chaos.command("report")
@click.argument("ab_json", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--readme", type=click.Path(exists=True, dir_okay=False), help="Replace the A/B block in this file."
)
@json_option('{"markdown": BLOCK} (with --readme: {"readme": FILE}) instead of the text.')
def report_cmd(ab_json: str, readme: str | None, as_json: bool) -> None:
    """Render AB_JSON (written by `chaos ab`, or `chaos ab-gang`'s ab-gang.json) as Markdown; with --readme,
    write it into that file (each kind of run has its own block)."""
    try:
        summary = json.loads(Path(ab_json).read_text())
        mod = gang_report if isinstance(summary, dict) and summary.get("kind") == "gang" else report_mod
        block = mod.render(summary)
    except (ValueError, KeyError, TypeError) as exc:
        raise click.ClickException(f"{ab_json}: not an A/B summary ({exc})") from None
    if readme is None:
        if as_json:
            emit({"markdown": block})
        else:
            click.echo(block, nl=False)
        return
    path = Path(readme)
    try:
        new = mod.splice(path.read_text(), block)
    except ValueError as exc:
        raise click.ClickException(f"{readme}: {exc}") from None
    path.write_text(new)
    if as_json:
        emit({"readme": readme})
    else:
        click.echo(f"wrote the A/B block into {readme}")


@chaos.command("restore")
@json_option('{"restored": true} instead of the sentence.')
def restore_cmd(as_json: bool) -> None:
    """Put the cluster back as `make up` leaves it after an interrupted run (hooks, switch, controller)."""
    try:
        ab_mod.Cluster(docker_exec, TimelineParams().nodes).restore()
    except ab_mod.ChaosError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        emit({"restored": True})
    else:
        click.echo("cluster restored: controller running with a fresh store, every node green")
