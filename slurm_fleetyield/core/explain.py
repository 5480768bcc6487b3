"""Explain: why a node is where it is, with every number behind it (``fleetyield explain NODE``).

Input: a node name and a ``TickResult``. Output: ``explain_dict`` a JSON-able dict (NaN written as None);
``explain`` the same as multi-line text (``explain_text`` formats such a dict): tier, health, risk, reason,
Slurm state, features and weight, the envelope, the lifecycle stage, an open drain proposal, the lemon flag
and the learned multipliers, the stake rule's arithmetic (``stake``: per class the node's hazard, the stake
and where it comes from, expected loss vs the cost of withholding, the decision and why; computed by
``core.stake.figures``, the function ``withhold`` decides by), then every GPU with its probability and each
enabled signal's value and log-odds contribution.
"""

from __future__ import annotations

import math
from typing import Any

from slurm_fleetyield.core import stake
from slurm_fleetyield.core.loop import TickResult
from slurm_fleetyield.core.model import NodeDecision
from slurm_fleetyield.core.risk import (
    CompiledSignal,
    compile_signals,
    fatal_events,
    history_decay,
    logit,
    signal_values,
)


def _num(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def explain_dict(node: str, result: TickResult) -> dict[str, Any]:
    d = result.nodes.get(node)
    r = result.risks.get(node)
    if d is None and r is None:
        raise KeyError(f"node {node!r} is not in this tick's result")
    out: dict[str, Any] = {
        "node": node,
        "horizon_days": _num(result.horizon_days),
        "base_probability": _num(result.base_probability),
    }
    if d is not None:
        e = d.envelope
        out.update(
            tier=d.tier.value,
            health=d.health.value,
            risk=_num(d.risk),
            reason=d.reason,
            managed=d.managed,
            slurm_state=d.slurm_state,
            weight=d.weight,
            features=list(d.features),
            fy_features=list(d.fy_features),
            evidence=list(d.evidence),
            envelope={
                "gpu_model": e.gpu_model,
                "premium": e.premium,
                "nvlink": e.nvlink,
                "nvlink_full": e.nvlink_full,
                "hbm_full": e.hbm_full,
                "known": e.known,
                "notes": list(e.notes),
            },
        )
    st = result.state
    lc = st.lifecycle.get(node)
    out["lifecycle"] = (
        {"stage": "in_service"}
        if lc is None
        else {
            "stage": lc.stage.value,
            "since": lc.since,
            "cause": lc.cause.text if lc.cause else None,
            "attempts": [f"{a.remediation.value}: {a.outcome}" for a in lc.attempts],
            "canary_passes": lc.canary_passes,
            "until": lc.until,
            "failures": len(lc.failures),
            "reason": lc.reason,
        }
    )
    prop = st.proposals.get(node)
    out["proposal"] = (
        None
        if prop is None
        else {
            "id": prop.proposal_id,
            "risk": prop.risk,
            "created_at": prop.created_at,
            "expires_at": prop.expires_at,
            "approved_by": prop.approved_by or None,
        }
    )
    out["lemon"] = d is not None and "fy_lemon" in d.fy_features
    out["stake"] = _stake(node, d, result)
    out["learned_multipliers"] = dict(st.learn.multipliers)
    gpus = []
    if r is not None:
        out.setdefault("health", r.health.value)
        out.setdefault("risk", _num(r.probability))
        out["risk_reason"] = r.reason
        out["sample_age_s"] = r.stale_s
        sensed, params = result.sensed, result.params
        compiled = () if sensed is None or params is None else compile_signals(params, sensed.layout)
        for g in r.gpus:
            signals = _signals(node, g.uuid, result, compiled)
            if not signals:  # no sensed inputs (e.g. a result rebuilt elsewhere): the fired ones only
                signals = [
                    {"signal": c.signal, "value": c.value, "contribution": c.weight} for c in g.contributions
                ]
            gpus.append(
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "model": g.model,
                    "health": g.health.value,
                    "probability": g.probability,
                    "fatal_xids": list(g.fatal_xids),
                    "signals": signals,
                }
            )
    out["gpus"] = gpus
    return out


def _fin(x: float) -> float | None:
    """JSON has no NaN or infinity (a risk of 1 is an infinite hazard): null."""
    return x if math.isfinite(x) else None


def _stake(node: str, d: NodeDecision | None, result: TickResult) -> dict[str, Any] | None:
    """The stake rule's figures for ``node`` this tick (None: the rule is off or the result has no stakes)."""
    wh, params = result.withheld, result.params
    if wh is None or params is None or not params.stake.enabled or d is None:
        return None
    gpus = wh.gpus.get(node)
    if gpus is None:
        why = (
            "not managed by FleetYield"
            if not d.managed
            else f"tier {d.tier.value}: its class features come from its tier or stage, not the stake rule"
        )
        return {"weighed": False, "why": why}
    horizon_s = params.risk.horizon_days * 86_400.0
    withheld = wh.nodes.get(node, frozenset())
    cap = params.stake.withhold_cap_fraction
    rows = []
    base = stake.base_risk(gpus, wh.multiplier, params)
    figs = stake.figures(wh.stakes, d.risk, gpus, horizon_s, base)
    for fig in figs:
        s = fig.stake
        feature = stake.CLASS_FEATURE[s.workload]
        cs = params.stake.classes[s.workload]
        if math.isnan(fig.loss):
            decision, why = "carried", "risk unknown: the node keeps the class features it carries"
        elif feature in withheld:
            decision, why = "withheld", "expected loss above the work the class would do there"
        elif fig.withhold and s.workload in wh.tripped:
            decision = "carried_by_breaker"
            why = (
                f"expected loss above the work it would do, but withholding {feature} from every such node "
                f"would pass the capacity breaker ({cap:.0%} of {wh.service_gpus} in-service GPUs, leaving "
                f"room for the largest pending {s.workload} job) while {s.workload} work is pending: the "
                "lower-loss nodes keep it"
            )
        else:
            decision, why = "carried", "expected loss not above the work the class would do there"
        rows.append(
            {
                "class": s.workload,
                "feature": feature,
                "stake_gpus": s.gpus,
                "lost_s": s.lost_s,
                "checkpoint_s": cs.checkpoint_s,
                "run_s": cs.run_s,
                "restart_s": cs.restart_s,
                "source": None
                if s.job_id is None
                else {"job_id": s.job_id, "gpus": s.job_gpus, "state": s.job_state},
                "loss_gpu_h_per_h": _fin(fig.loss),
                "cost_gpu_h_per_h": fig.cost,
                "decision": decision,
                "why": why,
                "carries": feature in d.fy_features,
            }
        )
    lam = figs[0].hazard_per_s if figs else stake.hazard_per_s(d.risk, horizon_s)
    return {
        "weighed": True,
        "gpus": gpus,
        "risk": _num(d.risk),
        "horizon_days": params.risk.horizon_days,
        "hazard_per_h": _fin(lam * 3600.0) if not math.isnan(lam) else None,
        "base_risk": _num(base),
        "base_multiplier": wh.multiplier,
        "classes": rows,
    }


def _stake_text(st: dict[str, Any] | None) -> list[str]:
    if st is None:
        return []
    if not st["weighed"]:
        return [f"stake: not weighed ({st['why']})"]
    h = st["hazard_per_h"]
    risk = "unknown" if st["risk"] is None else f"{st['risk']:.4f}"
    hazard = "unknown" if st["risk"] is None else ("infinite" if h is None else f"{h:.3g}/h")
    base = st.get("base_risk")
    lines = [
        f"stake: P(fatal) {risk} over {st['horizon_days']:g} d -> excess hazard {hazard} = (-ln(1 - P) + "
        f"ln(1 - base)) / horizon, base = P of a node with no risk signal "
        f"{base if base is None else f'{base:.4f}'} (learned base multiplier {st.get('base_multiplier')}); "
        f"{st['gpus']} GPUs; per class, in GPU-h per hour: expected loss = excess hazard x stake GPUs x "
        "lost h, cost of withholding = the GPUs the class would use here"
    ]
    for c in st["classes"]:
        src = c["source"]
        if src is None:
            whence = f"no {c['class']} job pending or running"
        else:
            whence = f"largest {c['class']} job {src['job_id']}: {src['gpus']} GPUs, {src['state']}"
            if src["gpus"] != c["stake_gpus"]:
                whence += ", rounded up to a power of two"
        half = (
            f"half the {c['checkpoint_s']:.0f} s checkpoint"
            if c["checkpoint_s"]
            else f"half the {c['run_s']:.0f} s run (cannot checkpoint)"
        )
        loss = c["loss_gpu_h_per_h"]
        carries = "carries" if c["carries"] else "does not carry"
        lines.append(
            f"  {c['class']:<8} {c['feature']}: stake {c['stake_gpus']} GPU(s) ({whence}) x "
            f"{c['lost_s']:.0f} s ({half} + {c['restart_s']:.0f} s restart)"
        )
        lines.append(
            f"           expected loss {'infinite' if loss is None else f'{loss:.4g}'} vs cost "
            f"{c['cost_gpu_h_per_h']:g} -> {c['decision']}: {c['why']}; the node {carries} {c['feature']}"
        )
    return lines


def _signals(
    node: str, uuid: str, result: TickResult, compiled: tuple[CompiledSignal, ...]
) -> list[dict[str, Any]]:
    """Recompute every enabled signal of one GPU from the tick's own inputs (same functions as risk)."""
    if result.sensed is None or result.params is None or result.previous is None:
        return []
    sn = result.sensed.nodes.get(node)
    gpu = next((g for g in sn.gpus if g.reading.uuid == uuid), None) if sn is not None else None
    if gpu is None:
        return []
    events = fatal_events(result.previous, node, result.params, result.now)
    history = [u for _, u in events]
    n_gpu = history.count(uuid)
    decay = history_decay(events, result.params, result.now)
    rows = signal_values(gpu, compiled, n_gpu, len(history) - n_gpu, decay)
    return [{"signal": n, "value": v, "contribution": c} for n, v, c in rows]


def explain(node: str, result: TickResult) -> str:
    return explain_text(explain_dict(node, result))


def explain_text(x: dict[str, Any]) -> str:
    """``explain_dict``'s document as the multi-line text ``fleetyield explain`` prints."""
    node = x["node"]
    risk = x.get("risk")
    lines = [
        f"node {node}: tier {x.get('tier', '?')}, health {x.get('health', '?')}, "
        f"risk {'unknown' if risk is None else f'{risk:.4f}'} "
        f"(P(fatal GPU failure within {x['horizon_days']:g} days); base per GPU {x['base_probability']:.5f}, "
        f"logit {logit(x['base_probability']):+.2f})",
        f"reason: {x.get('reason', x.get('risk_reason', ''))}",
    ]
    if "weight" in x:
        lines.append(f"slurm: state {x['slurm_state'] or '?'}, weight {x['weight']}, managed {x['managed']}")
        lines.append(f"features: {','.join(x['features'])}")
        e = x["envelope"]
        lines.append(
            f"envelope: model {e['gpu_model'] or '?'}, premium {e['premium']}, nvlink {e['nvlink']}, "
            f"nvlink_full {e['nvlink_full']}, hbm_full {e['hbm_full']}, known {e['known']}"
        )
        lines.extend(f"  note: {n}" for n in e["notes"])
    lc = x["lifecycle"]
    if lc["stage"] != "in_service":
        tried = f", attempts {', '.join(lc['attempts'])}" if lc["attempts"] else ""
        lines.append(
            f"lifecycle: {lc['stage']} since {lc['since']:.0f} (cause {lc['cause'] or '?'}{tried}; "
            f"failures in window {lc['failures']})"
        )
    else:
        lines.append("lifecycle: in service")
    if x["proposal"]:
        p = x["proposal"]
        approved = f", approved by {p['approved_by']} (drain pending)" if p["approved_by"] else ""
        lines.append(
            f"drain proposal: {p['id']} open (risk {p['risk']:.3f}, expires {p['expires_at']:.0f}){approved}"
        )
    if x["lemon"]:
        lines.append(
            "lemon: repeated fatal failures - no fy_ok_train/fy_ok_finetune/fy_ok_decode "
            "(off gangs and premium-class work), fy_ok_batch kept when healthy"
        )
    lines.extend(_stake_text(x.get("stake")))
    if x["learned_multipliers"]:
        ms = ", ".join(f"{k} x{v:.2f}" for k, v in sorted(x["learned_multipliers"].items()))
        lines.append(f"learned hazard multipliers: {ms}")
    if x.get("sample_age_s") is not None:
        lines.append(f"sample age: {x['sample_age_s']:.0f}s")
    for g in x["gpus"]:
        xids = f", fatal XID {','.join(map(str, g['fatal_xids']))}" if g["fatal_xids"] else ""
        lines.append(
            f"gpu {g['index']} {g['uuid']} ({g['model']}): p={g['probability']:.4f} {g['health']}{xids}"
        )
        for s in g["signals"]:
            v = "n/a" if s["value"] is None else f"{s['value']:g}"
            lines.append(f"    {s['signal']:<28} value {v:>10}  contribution {s['contribution']:+.2f}")
    if x.get("evidence"):
        lines.append("evidence:")
        lines.extend(f"  {e}" for e in x["evidence"])
    return "\n".join(lines)
