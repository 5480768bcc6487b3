"""Parameters of the stages that place work: price (weights), stake (expected-loss class features and the
drain's economics), premium widening, gang widening, keep open and premium reclaim (hot spares:
core/params_spares.py).

core/params.py gathers them into ``Params``; every default states where it comes from.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator

from slurm_fleetyield.core.params_base import _FROZEN, _LAX, _workload_classes


class PriceParams(BaseModel):
    """Node weights (Slurm's shadow prices). The defaults and their rationale live in core/price.py."""

    model_config = _FROZEN

    tier_weights: dict[str, int] = Field(
        default_factory=dict,
        description="Override of the weight per tier name (green, yellow, red, quarantined, canary, "
        "probation, retired). Slurm allocates the LOWEST weight first.",
    )
    premium_offset: int | None = Field(
        None,
        ge=0,
        description="Override of the weight added to premium nodes (default in core/weights.py: 1,000 under "
        "either rule, with or without the premium reservation: work that does not need premium GPUs takes "
        "them last; 0: no premium shadow price).",
    )

    @field_validator("tier_weights")
    @classmethod
    def _tiers(cls, v: dict[str, int]) -> dict[str, int]:
        from slurm_fleetyield.core.model import Tier

        names = {t.value for t in Tier} - {Tier.UNKNOWN.value}
        for k, w in v.items():
            if k not in names:
                raise ValueError(f"unknown tier {k!r} in tier_weights; known: {sorted(names)}")
            if not 1 <= w < 2**31:
                raise ValueError(f"weight of tier {k!r} must be in 1..2^31-1, got {w!r}")
        return v


class ClassStake(BaseModel):
    """What a fault costs one workload class's work (core/stake.py)."""

    model_config = _FROZEN

    checkpoint_s: float = Field(
        3600.0,
        ge=0,
        description="Checkpoint interval: a fault loses half of it on average. 0: the work cannot "
        "checkpoint and a fault loses half its run (run_s).",
    )
    run_s: float = Field(
        86_400.0, gt=0, description="Typical run length (used only when checkpoint_s is None)."
    )
    checkpoint_signals: Literal["off", "steps", "batch"] = Field(
        "off",
        description="Jobs of this class follow the checkpoint-signal convention: on SIGUSR2 they "
        "checkpoint and keep running, on SIGUSR1 they checkpoint and requeue themselves (scontrol requeue "
        "$SLURM_JOB_ID, as PyTorch Lightning's SLURM auto-requeue does). 'steps': the srun-launched "
        "processes handle them (scancel --signal=SIG JOB; Lightning's way); 'batch': the batch script traps "
        "them (scancel --batch). FleetYield then sends USR2 with a drain proposal and USR1 right after an "
        "approved drain instead of requeueing the job. 'off' by default: a process that does not handle "
        "the signal is killed by it.",
    )
    restart_s: float = Field(
        600.0,
        ge=0,
        description="Restart cost of an interrupted job, per GPU it holds: requeue, scheduling, "
        "initialisation, checkpoint load (assumption, minutes; Meta RSC arXiv 2410.21680 counts it in "
        "the lost time of every interruption).",
    )

    @property
    def lost_s(self) -> float:
        """Seconds each GPU of an interrupted job loses: half a checkpoint interval (half the run when it
        cannot checkpoint) of progress, plus the restart."""
        return (self.checkpoint_s or self.run_s) / 2 + self.restart_s


def _default_stakes() -> dict[str, ClassStake]:
    # Sources: the simulator's trace conventions (sim/traces.py): training checkpoints hourly, batch every
    # 30 min (assumptions, swept there). Decode is an inference service: what it served is served, so a
    # fault costs it the requests in flight (~a minute: a 2-minute "interval", half of it lost) and the
    # restart, not half its run (sim/runner.py, service_loss "inflight").
    return {
        "pretrain": ClassStake(checkpoint_s=3600.0),
        "finetune": ClassStake(checkpoint_s=3600.0),
        "batch": ClassStake(checkpoint_s=1800.0),
        "decode": ClassStake(checkpoint_s=120.0),
    }


class StakeParams(BaseModel):
    """Risk priced by what it puts at stake (core/stake.py): which nodes carry which class features."""

    model_config = _FROZEN

    enabled: bool = Field(
        True,
        description="Class features follow expected loss: a node carries a class's fy_ok_* feature unless "
        "the work that would land there stands to lose more per hour (its fatal hazard x the GPUs a fault "
        "kills x the progress lost + restart) than the GPU-hours it would do there. false: the old "
        "absolute tier rule (fy_ok_train/finetune/decode on green nodes only, fy_ok_batch on green, yellow "
        "and probation).",
    )
    classes: dict[str, ClassStake] = Field(
        default_factory=_default_stakes,
        description="Per workload class: checkpoint interval, run length, restart cost.",
    )
    repair_s: float = Field(
        86_400.0,
        gt=0,
        description="Downtime of a node after a fatal fault (reset, diagnostics, repair; assumption, the "
        "simulator's repair_h). A pre-emptive drain proposal pays only when P(fault) x (the running work's "
        "stake + GPUs x repair_s) exceeds GPUs x drain_s + the progress the requeue loses.",
    )
    drain_s: float = Field(
        86_400.0,
        gt=0,
        description="Downtime of a pre-emptive drain (GPU swap or repair; assumption, the simulator's "
        "swap_h).",
    )
    drain_precision: float = Field(
        0.5,
        gt=0,
        le=1,
        description="The most a pre-emptive drain trusts a telemetry risk: drain_pays weighs the averted "
        "loss at min(risk, drain_precision). A precursor signature (ECC, row remapping, link errors) also "
        "shows on GPUs that do not fail, as often as on those that do by the simulator's default "
        "(--false-alarm-ratio 1, an assumption), and the additive risk model reads several signals of one "
        "episode as independent evidence (p ~0.99 on benign episodes, simulated): a drain is paid for by "
        "what it averts at the precision such evidence can have. Fatal evidence (XIDs) does not go this way: "
        "it quarantines at once.",
    )
    withhold_cap_fraction: float = Field(
        0.2,
        ge=0,
        le=1,
        description="Capacity breaker: FleetYield never withholds a class feature from more than this share "
        "of the in-service GPUs that could serve the class while the class has pending work; past it the "
        "lowest-loss nodes keep the feature, and the breaker is reported (log, metric, status).",
    )

    @field_validator("classes")
    @classmethod
    def _known(cls, v: dict[str, ClassStake]) -> dict[str, ClassStake]:
        _workload_classes(tuple(v), "stake.classes")
        return v


class PremiumParams(BaseModel):
    """Premium widening (core/premium.py): lend fy_ok_decode to idle premium nodes while decode is stuck,
    except the nodes pending premium-needing work can start on now and a reserve. The reservation is a shadow
    price (weights), not a wall."""

    model_config = _FROZEN

    reserve: bool = Field(
        False,
        description="Keep decode off premium nodes (fy_ok_decode on a premium node only when lent by premium "
        "widening). Off by default: in net goodput a reservation can only move work between GPUs, never add "
        "any, and simulated it cost goodput wherever premium-needing work did not fill the premium GPUs "
        "(openb 32x30 at 1 interruption per 1,000 node-days: -0.22% with it, +0.01% without, "
        "docs/results.md 'Stake'). Where premium work must come first, Slurm's own preemption says so "
        "(QOS with PreemptMode=REQUEUE: contrib/slurm-docker-cluster/slurm.conf). true: the reservation, "
        "lent by premium widening (enabled). The premium shadow price (price.premium_offset: "
        "non-premium work takes premium GPUs last, an order, not a wall) applies either way.",
    )
    enabled: bool = Field(
        True,
        description="With reserve: lend fy_ok_decode to idle premium nodes when pending decode fits no "
        "non-premium node, "
        "except nodes that pending premium-needing jobs (settle.premium_needing_classes) can start on now "
        "and a reserve. Off: the old wall (decode never on premium GPUs), which on a decode-heavy fleet "
        "leaves premium GPUs idle while decode queues (simulated: -13% net goodput vs Slurm on the openb "
        "workload, docs/results.md).",
    )
    batch: bool = Field(
        False,
        description="Treat batch like decode on premium nodes: green premium nodes carry fy_ok_batch only "
        "when lent (batch or decode waiting for lend_after_s that fits no other node, outside the claims "
        "and the reserve), instead of always. Batch that starts on an idle H100 before premium work "
        "arrives holds it when a gang comes (live A/B at 7519a79: 80% of FleetYield's premium misuse). Off "
        "by default: simulated, it cut premium misuse (openb 32x30: 28,821 -> 24,155 GPU-h) but lost net "
        "goodput and made every class wait longer, pretrain included (openb -0.15% -> -4.31% vs Slurm; "
        "high-fault fleet +1.20% -> +0.43%; docs/results.md).",
    )
    reserve_nodes: int = Field(
        1,
        ge=0,
        description="Never lend the last this-many eligible premium nodes. Lent decode is not preempted when "
        "premium work arrives (Slurm preemption is out of scope), so the reserve is what a newly submitted "
        "premium job can start on at once.",
    )
    reserve_fraction: float = Field(
        0.10,
        ge=0,
        lt=1,
        description="... nor this fraction of them (rounded up); the larger of the two applies. 10%: one "
        "node in ten stays unlent, enough for a typical finetune without waiting for decode to drain.",
    )
    gang_memory_s: float = Field(
        7 * 86_400.0,
        gt=0,
        description="The reserve also covers the largest premium-needing job (in nodes) seen running or "
        "pending within this window: lent decode is not preempted, so a gang must find its nodes unlent. "
        "A week: longer than the gap between gangs of a training program, short enough to forget a one-off.",
    )
    gang_reserve_max_fraction: float = Field(
        0.5,
        ge=0,
        le=1,
        description="The gang term of the reserve covers at most this fraction of the eligible premium nodes "
        "(rounded down). A gang up to half the premium fleet finds its nodes unlent; a larger one finds half "
        "and waits for lent decode on the rest. 1: a gang as large as the premium fleet reserves all of it, "
        "which is the old wall (nothing is ever lent: simulated openb 16 nodes, +1.2% instead of +3.5% net "
        "goodput vs Slurm on tuning seeds 100-109); 0: no gang term (gangs rely on weights and backfill).",
    )
    lend_after_s: float = Field(
        300.0,
        ge=0,
        description="Decode must have been waiting (not fitting any fy_ok_decode node) for this long, across "
        "consecutive ticks, before a premium node is lent: a burst that the next scheduling passes absorb "
        "never touches premium GPUs. Five minutes: many Slurm scheduling passes, short against decode "
        "service lifetimes.",
    )
    hysteresis_s: float = Field(
        1800.0,
        ge=0,
        description="A lent node is returned only after decode has not been waiting for this long (premium "
        "demand withdraws at once). Half an hour: features do not flap with a queue that drains and "
        "refills between ticks.",
    )
    keep_decode_open: bool = Field(
        True,
        description="When no in-service non-premium node can carry fy_ok_decode (none exists, as on an "
        "all-H100 fleet, or all are yellow/red/drained), lend it to one unclaimed premium node outside the "
        'reserve. Slurm rejects at submission a job whose constraint no node has ("Requested node '
        'configuration is not available"): decode submitted through job_submit.lua would be refused, never '
        "pend, and so never trigger lending (live A/B seed 3: four decode jobs refused).",
    )
    claim_grace_s: float = Field(
        300.0,
        ge=0,
        description="A pending premium-needing job that fits the idle premium GPUs claims them (they are not "
        "lent) for this long; if Slurm has not started it by then it is waiting behind higher-priority work "
        "(or a limit FleetYield does not see), so its claim lapses and the GPUs may be lent instead of "
        "idling. Five minutes: many scheduling and backfill passes.",
    )


class GangParams(BaseModel):
    """Gang widening (core/gangs.py): lend fy_ok_train to yellow nodes while a training job waits for more
    green nodes than are idle."""

    model_config = _FROZEN

    enabled: bool = Field(
        True,
        description="When a pending job of a gangs.classes class needs more whole nodes than there are idle "
        "green trainable nodes (premium ones for a premium-needing class), lend fy_ok_train to that many "
        "yellow nodes (lowest risk first; never red, lemons or nodes in rehabilitation). Off: fy_ok_train on "
        "green nodes only, which in a fleet with many repaired (yellow) nodes keeps gangs waiting for days "
        "(simulated high-fault fleet: -10.5% net goodput vs Slurm off, docs/results.md).",
    )
    classes: Annotated[tuple[str, ...], _LAX] = Field(
        ("pretrain",),
        description="Workload classes whose jobs need fy_ok_train (job_submit.lua: pretrain) and may borrow "
        "yellow nodes.",
    )
    unclassified: bool = Field(
        True,
        description="Count pending jobs without a workload class too: job_submit.lua gives them class "
        "default and fy_ok_train, like pretrain. Their pool is every node (no class is premium-needing).",
    )
    lend_degrading: bool = Field(
        True,
        description="Lend yellow nodes that are degrading now too: a counter grew within the trend "
        "windows (ECC errors, remapped rows, NVLink/PCIe errors, throttling, risk-only XIDs: the precursor "
        "some fatal faults give). false: only yellow nodes without such growth (repaired ones, yellow "
        "through their fatal history, or a stable level) are lent to a training gang. Simulated, false "
        "gains nothing (high-fault fleet +0.09 points) and loses 1-5 points where repaired GPUs fail again "
        "(Titan worlds; docs/results.md, 'Degrading nodes'), so the default lends.",
    )

    @field_validator("classes")
    @classmethod
    def _known(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _workload_classes(v, "gangs.classes")


class KeepOpenParams(BaseModel):
    """Keep open (core/keep_open.py): no class feature job_submit.lua adds is left on no node."""

    model_config = _FROZEN

    enabled: bool = Field(
        True,
        description="When no node carries fy_ok_train, fy_ok_finetune or fy_ok_decode after routing (every "
        "green node that could is gone), one in-service yellow node with the envelope the feature needs "
        "carries it too (largest GPU count, then the node kept last tick, then the lowest risk). Slurm "
        "refuses at submission a job whose constraint no node has, so the class's jobs would be refused, "
        "never pend, and never trigger gang or premium widening. Off: such jobs are refused.",
    )


class ReclaimParams(BaseModel):
    """Premium reclaim (core/reclaim.py): batch requeued off premium GPUs a pending premium job needs."""

    model_config = _FROZEN

    enabled: bool = Field(
        False,
        description="Off by default: in net goodput a requeue for premium work only loses the requeued "
        "jobs' progress (simulated openb 32x30: ~49 GPU-h wasted per run, no less premium misuse); Slurm's "
        "own preemption (QOS PreemptMode=REQUEUE) is the shipped way to put premium work first. On: "
        "requeue checkpointable batch jobs (Slurm Requeue flag set, one node) off eligible "
        "premium nodes when a pending premium-needing job fits no idle premium GPUs but would once they "
        "leave, and keep fy_ok_batch (and any decode loan) off those nodes until that job is no longer "
        "pending. Batch that started on an idle H100 before premium work arrived otherwise holds it for "
        "its whole run (live A/B at 7519a79: 80% of FleetYield's premium misuse). Off: premium work waits "
        "for the batch to end.",
    )
    after_s: float = Field(
        600.0,
        ge=0,
        description="The premium job must have been pending, fitting no idle premium GPUs yet fitting with "
        "the batch gone, for this long (ticks in between) before anything is requeued: a queue that "
        "resolves itself (batch ending, another node freeing) costs no requeue.",
    )
    max_jobs_per_tick: int = Field(
        4, ge=1, description="At most this many batch jobs requeued per tick, fleet-wide (a storm cap)."
    )
    job_cooldown_s: float = Field(
        3600.0,
        ge=0,
        description="A batch job requeued by reclaim is not requeued by reclaim again for this long (no job "
        "is bounced from H100 to H100 while premium jobs keep arriving).",
    )
    queue_depth: int = Field(
        100,
        ge=1,
        description="Reclaim only for a premium job among the first this-many pending jobs (by job id): "
        "Slurm tests only the head of its queue per pass (default_queue_depth 100, bf_max_job_test), so "
        "GPUs freed for a job further back go to someone else. Set it to the site's bf_max_job_test.",
    )
    wall_s: float = Field(
        1800.0,
        gt=0,
        description="A reclaimed node keeps fy_ok_batch (and decode loans) off for at most this long, even "
        "if the premium job it was reclaimed for is still pending (something else holds it back).",
    )
    classes: Annotated[tuple[str, ...], _LAX] = Field(
        ("batch",),
        description="Workload classes that may be requeued (checkpointable by the site's convention; the job "
        "must also carry Slurm's Requeue flag).",
    )
