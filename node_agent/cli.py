"""``fleetyield-agent`` command line (click): serve, metrics, fault, check, reset, attest, quote.

Input: flags (and an optional TOML ``--config`` for ``serve``/``metrics``). Output: a running
exporter, or one action against the running server through the unix socket in the state
dir; when no server runs, the action edits the persisted state directly under the state
lock so the next start sees it. Bad flags or specs print a clear error and change nothing.
``--json`` on every verb that prints (fault, check, reset, metrics, attest ...) prints JSON, and an error as
``{"error": ...}`` on stderr (node_agent.clikit). Exit codes: 0 ok; 1 check failed; 2 usage/input error or
backend error; 3 (check only) no compute path on real GPUs (no libcuda.so.1).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import click

from node_agent.clikit import CliError, JsonErrorGroup, emit, json_option, version_option

STATE_DIR = click.option(
    "--state-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Agent state directory (fake GPU state, fatal.json, spool, control socket).",
)


# fault, reset and the attest verbs print JSON in any case; --json is taken for uniformity (and JSON errors)
JSON = json_option()


def _fail(message: str, code: int = 2) -> NoReturn:
    raise CliError(message, exit_code=code)


def _serve_options(f: Any) -> Any:
    opts = [
        click.option(
            "--config",
            "config_file",
            type=click.Path(dir_okay=False, path_type=Path),
            help="TOML file with the same settings (flags win).",
        ),
        click.option("--backend", type=click.Choice(["fake", "nvml"]), default=None),
        click.option("--listen", default=None, help="Address to bind (default 0.0.0.0)."),
        click.option("--port", type=int, default=None, help="Port (default 9400)."),
        click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None),
        click.option("--gpus", type=int, default=None, help="Fake backend: GPU count (default 8)."),
        click.option("--model", default=None, help="Fake backend: h100 | h200 | a100 | l40s."),
        click.option("--seed", type=int, default=None, help="Fake backend and scenario seed."),
        click.option("--hostname", default=None, help="Hostname label / node name (default: this host)."),
        click.option(
            "--lowercase-hostname",
            is_flag=True,
            default=None,
            help="Label the host as 'hostname' (dcgm-exporter main) instead of 'Hostname'.",
        ),
        click.option("--hpc-job-mapping-dir", type=click.Path(file_okay=False, path_type=Path), default=None),
        click.option("--xid-count-window-ms", type=int, default=None),
        click.option(
            "--nvml-slow-interval",
            "nvml_slow_interval_s",
            type=float,
            default=None,
            help="nvml backend: seconds between reads of the counters that cost ms per read (energy, "
            "power/thermal violation, PCIe replays); 0 reads them on every scrape (default 10).",
        ),
        click.option(
            "--push-url",
            multiple=True,
            help="Controller URL events are POSTed to; repeat it for two controllers (high availability): "
            "every event goes to each.",
        ),
        click.option("--push-secret-file", type=click.Path(dir_okay=False, path_type=Path), default=None),
        click.option(
            "--scenario",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            help="Fault timeline (JSON or TOML), fake backend only.",
        ),
        click.option(
            "--outcomes-dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=None,
            help="Epilog job-outcome spool forwarded to the controller "
            "(default /var/spool/fleetyield/outcomes).",
        ),
        click.option(
            "--web-config-file",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            help="TLS and basic auth for /metrics: a web-config file in the Prometheus exporter-toolkit "
            "format (dcgm-exporter's --web-config-file).",
        ),
        click.option(
            "--max-connections",
            type=int,
            default=None,
            help="Connections the /metrics listener holds at once (default 256).",
        ),
        click.option(
            "--outcomes-url",
            multiple=True,
            help="Where outcomes are POSTed (default: /v1/agent/outcomes beside each push URL); repeat it "
            "for two controllers: each record goes to the first that takes it.",
        ),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _config(config_file: Path | None, flags: dict[str, Any]) -> Any:
    from node_agent.config import build_config

    for key in ("push_url", "outcomes_url"):  # not given: the config file's, if any
        if flags.get(key) == ():
            flags = {**flags, key: None}
    try:
        return build_config(config_file, flags)
    except ValueError as exc:
        _fail(str(exc))


class _AgentGroup(JsonErrorGroup):
    """Mounts ``attest`` and ``quote`` (node_agent/attest/cli.py) lazily: ``serve`` never imports them."""

    LAZY = ("attest", "quote")

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.LAZY])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.LAZY:
            from node_agent.attest import cli as attest_cli

            return getattr(attest_cli, cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_AgentGroup)
@version_option()
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """FleetYield node agent: dcgm-exporter-compatible GPU metrics, fault injection, checks."""
    # The Python environment is measured (attestation record hooks/python): the agent never writes byte
    # caches into it, so a lazily imported module cannot change the measurement after the baseline.
    sys.dont_write_bytecode = True
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@main.command()
@_serve_options
def serve(config_file: Path | None, **flags: Any) -> None:
    """Serve /metrics (default :9400) until SIGTERM."""
    from node_agent.attest.config import load_attest_config
    from node_agent.backends.base import BackendError
    from node_agent.exporter import Server
    from node_agent.faults import FaultSpecError

    cfg = _config(config_file, flags)
    try:
        Server(cfg, attest=load_attest_config(config_file)).run_forever()
    except (BackendError, FaultSpecError, ValueError, OSError) as exc:
        _fail(str(exc))


@main.command()
@_serve_options
@json_option("The exposition's metric families as JSON (name, type, help, samples with labels).")
def metrics(config_file: Path | None, as_json: bool, **flags: Any) -> None:
    """Print one exposition to stdout (fake state is read, not changed)."""
    from node_agent.agent import Agent
    from node_agent.backends.base import BackendError
    from node_agent.exporter import make_backend, make_registry
    from node_agent.exposition import render

    cfg = _config(config_file, flags)
    try:
        if cfg.backend == "fake" and (cfg.state_dir / "fake_state.json").exists():
            backend = _offline_fake(cfg.state_dir)
        else:
            backend = make_backend(cfg, time.time)
            backend.start()
        agent = Agent(backend, cfg.state_dir, cfg.node_name(), time.time)
        text = render(make_registry(agent, cfg))
        backend.stop()
        if as_json:
            emit(_families(text.decode()))
        else:
            sys.stdout.buffer.write(text)
    except (BackendError, ValueError) as exc:
        _fail(str(exc))


def _families(exposition: str) -> list[dict[str, Any]]:
    from prometheus_client.parser import text_string_to_metric_families

    return [
        {
            "name": f.name,
            "type": f.type,
            "help": f.documentation,
            "samples": [{"name": s.name, "labels": s.labels, "value": s.value} for s in f.samples],
        }
        for f in text_string_to_metric_families(exposition)
    ]


# ---------------------------------------------------------------- offline / socket plumbing
def _offline_fake(state_dir: Path) -> Any:
    from node_agent import state as st
    from node_agent.backends.base import BackendError
    from node_agent.backends.fake import FakeBackend

    s = st.load(state_dir)
    if s is None:
        raise BackendError(
            f"no fake GPU state in {state_dir} (start `fleetyield-agent serve --backend fake "
            f"--state-dir {state_dir}` once to create it)"
        )
    b = FakeBackend(state_dir, s.hostname, gpus=len(s.gpus), model=s.model, seed=s.seed)
    b.state = s
    return b


@contextlib.contextmanager
def _offline_agent(state_dir: Path, backend_name: str | None = None) -> Iterator[Any]:
    """An Agent over the persisted state, holding the state lock for the whole operation."""
    from node_agent import state as st
    from node_agent.agent import Agent
    from node_agent.backends.fake import FakeBackend
    from node_agent.backends.nvml import NvmlBackend

    if backend_name == "nvml" or (backend_name is None and not (state_dir / st.STATE_FILE).exists()):
        import socket

        yield Agent(NvmlBackend(socket.gethostname()), state_dir, socket.gethostname(), time.time)
        return
    with st.locked(state_dir):
        backend: FakeBackend = _offline_fake(state_dir)
        backend.in_transaction = True
        yield Agent(backend, state_dir, backend.node, time.time)


def _run(
    state_dir: Path, request: dict[str, Any], backend: str | None = None, timeout_s: float = 10.0
) -> Any:
    """Through the socket when a server runs, else directly on the persisted state."""
    from node_agent import control, state
    from node_agent.backends.base import BackendError
    from node_agent.faults import FaultSpecError, parse_fault

    try:
        if request.get("spec") is not None:
            parse_fault(request["spec"])  # reject a bad spec before touching anything
        if state.server_running(state_dir):
            return control.call(state_dir, request, timeout_s)
        with _offline_agent(state_dir, backend) as agent:
            req = control.ControlRequest.model_validate(request)
            result = control.dispatch(agent, req)
            return result
    except (control.ControlError, BackendError, FaultSpecError, ValueError, OSError) as exc:
        _fail(str(exc))


def _print(result: Any) -> None:
    emit(result)


# ---------------------------------------------------------------- fault commands
@main.group()
def fault() -> None:
    """Inject, list and clear faults on the fake backend (local only)."""


def _reset_opt(f: Any) -> Any:
    return click.option(
        "--reset-fixes/--no-reset-fixes",
        default=None,
        help="Whether a GPU reset clears this fault (default: yes, except corrupt and XID 64).",
    )(f)


@fault.command("inject")
@STATE_DIR
@click.option("--gpu", type=int, required=True)
@click.option("--xid", type=int, required=True, help="XID number (79 = fell off the bus, 48 = DBE, ...).")
@_reset_opt
@click.option(
    "--recovery-action",
    type=click.Choice(["none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset"]),
    default="none",
    show_default=True,
    help="What the driver asks for while the fault lasts (DCGM_FI_DEV_GPU_RECOVERY_ACTION; XID 154 "
    "announces it on real GPUs).",
)
@JSON
def fault_inject(
    state_dir: Path, gpu: int, xid: int, reset_fixes: bool | None, recovery_action: str, as_json: bool
) -> None:
    """Raise an XID on a GPU, with its realistic side effects."""
    spec = {
        "kind": "xid",
        "gpu": gpu,
        "xid": xid,
        "reset_fixes": reset_fixes,
        "recovery_action": recovery_action,
    }
    _print(_run(state_dir, {"op": "inject", "spec": spec}))


@fault.command("degrade")
@STATE_DIR
@click.option("--gpu", type=int, required=True)
@click.option("--mode", type=click.Choice(["nvlink_crc", "ecc", "thermal"]), required=True)
@click.option("--rate", type=float, required=True, help="Growth per second (errors/s or C/s).")
@click.option("--threshold", type=int, default=None, help="ecc: remapped rows before remap pending.")
@click.option("--capacity-loss-mib", type=int, default=None, help="ecc: HBM lost when remapping fails.")
@click.option("--max-delta-c", type=float, default=None, help="thermal: maximum temperature rise.")
@_reset_opt
@JSON
def fault_degrade(
    state_dir: Path,
    gpu: int,
    mode: str,
    rate: float,
    threshold: int | None,
    capacity_loss_mib: int | None,
    max_delta_c: float | None,
    reset_fixes: bool | None,
    as_json: bool,
) -> None:
    """Start a gradual degradation."""
    spec: dict[str, Any] = {
        "kind": "degrade",
        "gpu": gpu,
        "mode": mode,
        "rate": rate,
        "reset_fixes": reset_fixes,
    }
    for key, value in (
        ("threshold", threshold),
        ("capacity_loss_mib", capacity_loss_mib),
        ("max_delta_c", max_delta_c),
    ):
        if value is not None:
            spec[key] = value
    _print(_run(state_dir, {"op": "inject", "spec": spec}))


@fault.command("corrupt")
@STATE_DIR
@click.option("--gpu", type=int, required=True)
@_reset_opt
@JSON
def fault_corrupt(state_dir: Path, gpu: int, reset_fixes: bool | None, as_json: bool) -> None:
    """Quiet data corruption: no metric changes; `check` fails."""
    _print(
        _run(state_dir, {"op": "inject", "spec": {"kind": "corrupt", "gpu": gpu, "reset_fixes": reset_fixes}})
    )


@fault.command("clear")
@STATE_DIR
@click.option("--gpu", type=int, default=None)
@click.option("--id", "fault_id", default=None)
@click.option("--all", "all_", is_flag=True, help="Clear every fault (of --gpu, or of all GPUs).")
@JSON
def fault_clear(state_dir: Path, gpu: int | None, fault_id: str | None, all_: bool, as_json: bool) -> None:
    """Remove faults (counters never go back; fatal.json entries of the faults are dropped)."""
    if not (fault_id or all_):
        _fail("say which faults: --id ID, or --all [--gpu N]")
    _print(_run(state_dir, {"op": "clear", "gpu": gpu, "fault_id": fault_id}))


@fault.command("list")
@STATE_DIR
@click.option("--gpu", type=int, default=None)
@JSON
def fault_list(state_dir: Path, gpu: int | None, as_json: bool) -> None:
    """List active faults as JSON."""
    _print(_run(state_dir, {"op": "list", "gpu": gpu}))


# ---------------------------------------------------------------- check / reset
CHECK_NO_COMPUTE_PATH = 3


@main.command()
@STATE_DIR
@click.option("--gpu", type=int, default=None)
@click.option(
    "--dcgm-diag-level",
    type=click.IntRange(0, 4),
    default=1,
    show_default=True,
    help="Real GPUs: also run `dcgmi diag -r N` when dcgmi is on PATH (0: skip it).",
)
@click.option(
    "--backend",
    type=click.Choice(["fake", "nvml"]),
    default=None,
    help="Only needed when no server runs (default: fake if fake state exists, else nvml).",
)
@json_option("Print the JSON report (errors as JSON on stderr).")
def check(state_dir: Path, gpu: int | None, dcgm_diag_level: int, backend: str | None, as_json: bool) -> None:
    """Active known-answer check per GPU (what a Slurm canary runs).

    Fake backend: a simulated compute that a `corrupt` fault falsifies. nvml backend: a small PTX kernel per
    GPU through the CUDA driver (libcuda.so.1, no toolkit), its 4096 words compared with the answer computed
    on the host, then `dcgmi diag -r N` where DCGM is installed.

    \b
    Exit codes:
      0  every GPU passed (and dcgmi diag, when it ran)
      1  a GPU failed: wrong answer, a CUDA error, not visible; or dcgmi diag failed
      2  usage, input or backend error
      3  no compute path: libcuda.so.1 missing or cuInit failing (nothing was checked)
    """
    from node_agent.cuda_check import DIAG_TIMEOUT_S

    # a kernel per GPU takes well under a second, plus context creation; dcgmi diag up to its own timeout
    wait_s = 60.0 + (DIAG_TIMEOUT_S[dcgm_diag_level] if dcgm_diag_level else 0)
    report = _run(state_dir, {"op": "check", "gpu": gpu, "diag_level": dcgm_diag_level}, backend, wait_s)
    if as_json:
        _print(report)
    else:
        for r in report["results"]:
            click.echo(f"gpu {r['gpu']} {r['uuid']}: {r['status']} ({r['detail']})")
        if report.get("diag"):
            click.echo(f"dcgmi: {'pass' if report['diag']['ok'] else 'fail'} ({report['diag']['detail']})")
        if report.get("unavailable"):
            click.echo(report["unavailable"], err=True)
    if report.get("unavailable"):
        sys.exit(CHECK_NO_COMPUTE_PATH)
    sys.exit(0 if report["ok"] else 1)


@main.command()
@STATE_DIR
@click.option("--gpu", type=int, required=True)
@click.option(
    "--backend",
    type=click.Choice(["fake", "nvml"]),
    default=None,
    help="Only needed when no server runs (default: fake if fake state exists).",
)
@JSON
def reset(state_dir: Path, gpu: int, backend: str | None, as_json: bool) -> None:
    """Reset a GPU (fake: clear reset-fixable faults; nvml: nvidia-smi --gpu-reset -i N)."""
    _print(_run(state_dir, {"op": "reset", "gpu": gpu}, backend))
