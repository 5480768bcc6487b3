from core.builders import Fleet, Runner
from slurm_fleetyield.core.model import Tier
from slurm_fleetyield.core.params import Params


def test_xid79_push_drains_with_our_reason_and_requeues_only_requeueable_running_jobs():
    f = Fleet(20)
    f.run_job(11, ("gpu003", "gpu004"), requeue=True)
    f.run_job(12, ("gpu003",), requeue=False)
    f.run_job(13, ("gpu003",), requeue=True, state="PENDING")
    f.run_job(14, ("gpu005",), requeue=True)
    f.run_job(15, ("gpu003",), requeue=True, state="COMPLETING")  # finished, its Epilog running: not re-run
    f.push("gpu003", 79, 3, 1_000_000.0)
    res = Runner(f).tick()
    (d,) = res.plan.of_kind("drain")
    assert d.node == "gpu003"
    assert d.reason == "fleetyield: XID 79 gpu 3 fell off the bus"
    assert d.requeue_jobs == (11,)
    assert res.nodes["gpu003"].tier is Tier.QUARANTINED
    assert "fy_tier_quarantined" in res.nodes["gpu003"].fy_features


def test_a_gpu_xid_requeues_only_the_jobs_holding_that_gpu():
    """Jobs on the node's healthy GPUs finish under the drain (remediation waits for them); the job on the
    dead GPU, and one whose GPUs Slurm did not say, are requeued. (Live A/B seeds 3 and 4: requeueing every
    job on the node wasted the work of jobs that bare Slurm let complete.)"""
    from slurm_fleetyield.core.model import JobView

    f = Fleet(20)
    f.jobs += [
        JobView(31, "RUNNING", ("gpu003",), True, gpus=2, gpu_index=(("gpu003", (2, 3)),)),  # holds GPU 3
        JobView(32, "RUNNING", ("gpu003",), True, gpus=2, gpu_index=(("gpu003", (0, 1)),)),  # healthy GPUs
        JobView(33, "RUNNING", ("gpu003",), True, gpus=1),  # indices unknown: assumed on GPU 3
    ]
    gang = (("gpu002", tuple(range(8))), ("gpu003", (4, 5, 6, 7)))
    f.jobs.append(JobView(34, "RUNNING", ("gpu002", "gpu003"), True, gpus=12, gpu_index=gang))
    f.push("gpu003", 48, 3, 1_000_000.0)
    (d,) = Runner(f).tick().plan.of_kind("drain")
    assert d.node == "gpu003" and d.requeue_jobs == (31, 33)


def test_node_wide_evidence_or_the_setting_requeues_every_job():
    from slurm_fleetyield.core.model import JobView

    def fleet() -> Fleet:
        f = Fleet(20)
        f.jobs += [
            JobView(31, "RUNNING", ("gpu003",), True, gpus=2, gpu_index=(("gpu003", (2, 3)),)),
            JobView(32, "RUNNING", ("gpu003",), True, gpus=2, gpu_index=(("gpu003", (0, 1)),)),
        ]
        return f

    f = fleet()
    f.nodes["gpu003"].hidden_gpus = {5}  # a GPU missing from the count: no index in the evidence
    (d,) = Runner(f).tick().plan.of_kind("drain")
    assert d.requeue_jobs == (31, 32)
    f = fleet()  # XID 79 and its GPU gone from the same scrape: the missing GPU is the one the XID names
    f.nodes["gpu003"].hidden_gpus = {3}
    f.push("gpu003", 79, 3, 1_000_000.0)
    (d,) = Runner(f).tick().plan.of_kind("drain")
    assert d.requeue_jobs == (31,)
    f = fleet()  # what the agent pushes for an XID 79: the XID and the GPU gone, both with its index
    f.push("gpu003", 79, 3, 1_000_000.0)
    f.push("gpu003", None, 3, 1_000_000.0, kind="gpu_missing", eid="agent-missing-3")
    (d,) = Runner(f).tick().plan.of_kind("drain")
    assert d.requeue_jobs == (31,)
    f = fleet()  # two GPUs gone, one XID: not explained, node-wide
    f.nodes["gpu003"].hidden_gpus = {3, 6}
    f.push("gpu003", 79, 3, 1_000_000.0)
    (d,) = Runner(f).tick().plan.of_kind("drain")
    assert d.requeue_jobs == (31, 32)
    f = fleet()
    f.push("gpu003", 79, 3, 1_000_000.0)
    whole = Params.model_validate({"quarantine": {"requeue_whole_node": True}})
    (d,) = Runner(f, whole).tick().plan.of_kind("drain")
    assert d.requeue_jobs == (31, 32)


def test_xid13_push_is_not_a_drain():
    f = Fleet(4)
    f.push("gpu000", 13, 0, 1_000_000.0)
    assert Runner(f).tick().plan.of_kind("drain") == ()


def test_fatal_xid_growth_in_scrape_drains_but_first_sight_is_baseline():
    f = Fleet(20)
    f.xid("gpu001", 2, 48, 1)  # already there at first sight: baseline, not new evidence
    r = Runner(f)
    assert r.tick().plan.of_kind("drain") == ()
    f.xid("gpu002", 5, 48, 1)
    (d,) = r.tick().plan.of_kind("drain")
    assert d.node == "gpu002" and d.reason == "fleetyield: XID 48 gpu 5 double-bit ECC error"


def test_gpu_missing_drains():
    f = Fleet(20)
    f.nodes["gpu007"].hidden_gpus = {5}
    (d,) = Runner(f).tick().plan.of_kind("drain")
    assert d.node == "gpu007" and "GPU missing (7 of 8 visible)" in d.reason


def test_gpu_missing_can_be_disabled():
    f = Fleet(20)
    f.nodes["gpu007"].hidden_gpus = {5}
    p = Params.model_validate({"quarantine": {"gpu_missing_quarantines": False}})
    assert Runner(f, p).tick().plan.of_kind("drain") == ()


def test_stale_node_is_never_drained_on_scrape_but_push_still_drains():
    f = Fleet(20)
    r = Runner(f)
    r.tick()
    f.nodes["gpu001"].sample_time = r.now - 10_000  # stale from now on
    f.nodes["gpu001"].hidden_gpus = {1}
    f.xid("gpu001", 2, 79)
    assert r.tick().plan.of_kind("drain") == ()
    f.push("gpu001", 79, 2, r.now)
    (d,) = r.tick().plan.of_kind("drain")
    assert d.node == "gpu001"


def test_idempotent_once_per_node():
    f = Fleet(20)
    f.push("gpu003", 79, 3, 1_000_000.0)
    f.push("gpu003", 95, 1, 1_000_000.5)
    r = Runner(f)
    first = r.tick()
    assert len(first.plan.of_kind("drain")) == 1
    # Slurm shows it drained by us, events processed: no new fatal drain; the lifecycle (which re-asserts its
    # own reason with the remediation) is the only actor now
    assert all(d.cause == "rehab" for d in r.tick().plan.of_kind("drain"))


def test_idempotent_when_slurm_does_not_show_the_drain():
    f = Fleet(20)
    f.push("gpu003", 79, 3, 1_000_000.0)
    r = Runner(f, apply=False)
    assert r.tick().plan.of_kind("drain")
    # The event id is remembered: no second fatal drain. The drain applied without a failure and Slurm does
    # not show it: someone lifted it (scontrol update is synchronous), so the admin's decision stands.
    second = r.tick()
    assert second.plan.of_kind("drain") == ()
    assert any(e.kind == "lifecycle" and e.message.startswith("admin_resumed") for e in second.events)
    assert second.nodes["gpu003"].tier is not Tier.QUARANTINED


def test_a_drain_that_failed_to_apply_is_reasserted():
    from dataclasses import replace

    from slurm_fleetyield.core.loop import tick
    from slurm_fleetyield.core.model import FailedAction

    f = Fleet(20)
    f.push("gpu003", 79, 3, 1_000_000.0)
    r = Runner(f, apply=False)
    (first,) = r.tick().plan.of_kind("drain")
    assert first.cause == "fatal"
    now = r.now + r.step
    obs = replace(f.observe(now), failed_actions=(FailedAction("drain", "gpu003", "slurm_load_node error"),))
    again = tick(r.state, obs, r.params, now, r.rng)
    assert [(d.node, d.cause) for d in again.plan.of_kind("drain")] == [("gpu003", "rehab")]


def test_storm_is_capped_with_holds():
    f = Fleet(50)
    for i in range(45):
        f.push(f"gpu{i:03d}", 79, 0, 1_000_000.0 + i)
    res = Runner(f).tick()
    drains = res.plan.of_kind("drain")
    assert len(drains) == 3  # rate window: 3 per 600 s (cap would allow 5)
    assert len(res.plan.holds) == 42
    assert {h.rule for h in res.plan.holds} == {"drain_rate"}
    assert sum(1 for e in res.events if e.kind == "hold") == 42
    held = res.nodes["gpu010"]
    assert held.tier is not Tier.QUARANTINED and "drain held" in held.reason


def test_fleet_cap_counts_nodes_already_drained_by_us():
    f = Fleet(30)  # cap = 3 nodes
    for i in range(3):
        f.drain_by_admin(f"gpu{i:03d}", f"fleetyield: XID 79 gpu 0 fell off the bus #{i}")
    f.push("gpu010", 79, 0, 1_000_000.0)
    res = Runner(f).tick()
    assert res.plan.of_kind("drain") == ()
    (h,) = res.plan.holds
    assert h.rule == "drain_cap" and h.node == "gpu010" and h.action == "drain"


def test_rate_window_releases_after_window():
    f = Fleet(100)
    for i in range(5):
        f.push(f"gpu{i:03d}", 79, 0, 1_000_000.0)
    r = Runner(f, step=30)
    assert len(r.tick().plan.of_kind("drain")) == 3
    # still inside the 600 s window: no new fatal drain (the drained ones start their remediation)
    assert [d for d in r.tick().plan.of_kind("drain") if d.cause == "fatal"] == []
    r.now += 600
    # held evidence reconsidered, drained now
    assert len([d for d in r.tick().plan.of_kind("drain") if d.cause == "fatal"]) == 2


def test_slurm_unreadable_gives_empty_plan():
    f = Fleet(5)
    f.push("gpu003", 79, 3, 1_000_000.0)
    f.slurm_ok = False
    res = Runner(f).tick()
    assert res.plan.empty and res.plan.holds == ()


def test_attestation_failure_drains_through_the_fatal_path_naming_the_records():
    f = Fleet(20)
    f.run_job(21, ("gpu004",), requeue=True)
    f.push("gpu004", None, None, 1_000_000.0, kind="attestation_failed", eid="attest:gpu004:1",
           message="/etc/ld.so.preload, kernel/modules")  # fmt: skip
    r = Runner(f)
    res = r.tick()
    (d,) = res.plan.of_kind("drain")
    assert d.node == "gpu004" and d.requeue_jobs == (21,)
    assert d.reason == "fleetyield: attestation failed (/etc/ld.so.preload, kernel/modules)"
    assert res.nodes["gpu004"].tier is Tier.QUARANTINED
    assert r.tick().plan.of_kind("drain") == ()  # the same verdict (event id) is never acted on twice


def test_held_evidence_is_kept_when_the_shell_hands_each_event_in_once():
    """The daemon acknowledges every inbox event after a tick (and the simulator hands each in once): a drain
    held by the cap must still happen once the cap has room, from the evidence the core kept. (Live A/B seed
    3: an XID 48 held by the cap was forgotten; its node was priced by risk alone, weight 10, most wanted.)"""
    f = Fleet(30)  # cap = 3 nodes
    for i in range(3):
        f.drain_by_admin(f"gpu{i:03d}", f"fleetyield: XID 79 gpu 0 fell off the bus #{i}")
    r = Runner(f)
    r.tick()  # gpu010 green, with its features
    f.push("gpu010", 48, 2, r.now)
    first = r.tick()
    assert first.plan.of_kind("drain") == () and [h.node for h in first.plan.holds] == ["gpu010"]
    assert [e.node for e in r.state.held_fatal] == ["gpu010"]
    f.events.clear()  # acknowledged: never handed in again
    second = r.tick()
    assert [(h.node, h.rule) for h in second.plan.holds] == [("gpu010", "drain_cap")]
    assert "drain held" in second.nodes["gpu010"].reason  # not priced by risk as if nothing happened
    assert second.nodes["gpu010"].weight == 6_000  # red weight plus the premium offset (an H100 node)
    # the agent pushed it (its fatal marker: the Prolog refuses every job here): no class feature, tier kept
    fy = ("fy_hbm_full", "fy_nvlink_full", "fy_premium", "fy_tier_green")
    assert second.nodes["gpu010"].fy_features == fy
    assert "the Prolog refuses every job here" in second.nodes["gpu010"].reason
    f.slurm_update("gpu000", states=frozenset({"IDLE"}), reason="")  # one of ours is back: room under the cap
    third = r.tick()
    (d,) = [d for d in third.plan.of_kind("drain") if d.cause == "fatal"]
    assert d.node == "gpu010" and d.reason == "fleetyield: XID 48 gpu 2 double-bit ECC error"
    assert r.state.held_fatal == ()
    assert r.tick().plan.holds == ()  # processed: never held or drained again


def _cap_full(f: Fleet) -> None:
    for i in range(3):  # cap = 3 nodes of 30, all drained by us
        f.drain_by_admin(f"gpu{i:03d}", f"fleetyield: XID 79 gpu 0 fell off the bus #{i}")


def test_a_held_node_on_its_agents_evidence_is_fenced_off_new_jobs_not_drained():
    """Live A/B at 9777272, seed 3: an XID 48 pushed by gpu-l40s-2's agent, drain held by the cap; the node
    kept fy_ok_train, an 8-GPU pretrain landed there, failed its Prolog (the agent's fatal marker), was
    requeued held and waited 60 s for an operator while batch and decode held the H100 it needed."""
    f = Fleet(30)
    _cap_full(f)
    f.run_job(41, ("gpu010",), requeue=True)
    r = Runner(f)
    before = r.tick().nodes["gpu010"]
    assert {"fy_ok_batch", "fy_ok_train", "fy_ok_finetune"} <= set(before.fy_features)
    f.push("gpu010", 79, 3, r.now)
    res = r.tick()
    assert [(h.node, h.rule) for h in res.plan.holds] == [("gpu010", "drain_cap")]
    assert res.plan.of_kind("drain") == ()  # the cap still governs the drain: running job 41 is not requeued
    d = res.nodes["gpu010"]
    assert not [x for x in d.fy_features if x.startswith("fy_ok_")], d.fy_features
    assert "fy_tier_green" in d.fy_features and d.weight == 6_000  # last tier, red weight (+ premium offset)
    (u,) = [u for u in res.plan.of_kind("update") if "gpu010" in u.nodes]
    assert not [x for x in u.features if x.startswith("fy_ok_")], u.features
    f.slurm_update("gpu000", states=frozenset({"IDLE"}), reason="")  # room under the cap: drained at last
    (drain,) = [x for x in r.tick().plan.of_kind("drain") if x.cause == "fatal"]
    assert drain.node == "gpu010"


def test_held_scrape_evidence_keeps_the_class_features_a_storm_must_not_strip_the_fleet():
    f = Fleet(30)
    _cap_full(f)
    f.xid("gpu010", 2, 48, 1)
    r = Runner(f)
    r.tick()  # first sight: baseline
    f.xid("gpu010", 2, 48, 1)  # grows in a fresh scrape: fatal evidence, not from the agent's marker
    res = r.tick()
    assert [(h.node, h.rule) for h in res.plan.holds] == [("gpu010", "drain_cap")]
    assert {"fy_ok_batch", "fy_ok_train"} <= set(res.nodes["gpu010"].fy_features)


def test_the_fence_can_be_turned_off_for_sites_without_the_prolog():
    f = Fleet(30)
    _cap_full(f)
    p = Params.model_validate({"quarantine": {"fence_held_agent_evidence": False}})
    r = Runner(f, p)
    r.tick()
    f.push("gpu010", 48, 2, r.now)
    res = r.tick()
    assert res.plan.holds and "fy_ok_batch" in res.nodes["gpu010"].fy_features


def test_held_evidence_expires_with_a_log_line():
    f = Fleet(30)
    for i in range(3):
        f.drain_by_admin(f"gpu{i:03d}", f"fleetyield: XID 79 gpu 0 fell off the bus #{i}")
    p = Params.model_validate({"quarantine": {"held_evidence_max_age_s": 100.0}})
    r = Runner(f, p, step=60)
    f.push("gpu010", 48, 2, r.now)
    assert r.tick().plan.holds
    f.events.clear()
    assert r.tick().plan.holds  # 60 s old: still held
    late = r.tick()  # 120 s old: dropped, said once
    assert late.plan.holds == () and r.state.held_fatal == ()
    (ev,) = [e for e in late.events if e.kind == "held_evidence_expired"]
    assert ev.node == "gpu010" and "XID 48 gpu 2" in ev.message
    assert not any(e.kind == "held_evidence_expired" for e in r.tick().events)


def test_processed_index_is_kept_while_the_ids_are_the_same_tuple():
    from dataclasses import replace

    from slurm_fleetyield.core import quarantine
    from slurm_fleetyield.core.state import ControllerState

    pre = quarantine.PUSHED_XID_PREFIX
    ids = ("ev-1", f"{pre}n1:3:79:1000.0", f"{pre}n1:3:79:900.0")
    st = ControllerState(processed_events=ids)
    first = quarantine.processed(st)
    assert quarantine.processed(st) is first
    assert first.done == frozenset(ids) and first.pushed == {("n1", 3, 79): 1000.0} and not first.has_missing
    more = replace(st, processed_events=(*ids, f"{quarantine.MISSING_KEY_PREFIX}n2:7/8"), memo=st.memo)
    second = quarantine.processed(more)
    assert second is not first and second.has_missing and len(second.done) == 4


def test_remember_hands_on_the_same_ids_when_none_was_added_or_dropped():
    f = Fleet(2)
    r = Runner(f)
    r.tick()
    f.push("gpu000", 79, 3, r.now)
    r.tick()
    ids = r.state.processed_events
    assert ids, "the drained XID is remembered"
    r.tick()
    assert r.state.processed_events is ids  # nothing new: the very tuple (find_fatal's index is kept)


def test_find_fatal_reads_only_the_flagged_nodes_and_finds_what_a_full_scan_finds():
    """sense flags the fresh nodes with grown XID counts or missing GPUs; find_fatal looks at those only."""
    from dataclasses import replace

    from slurm_fleetyield.core import quarantine

    f = Fleet(20)
    r = Runner(f)
    r.tick()
    f.xid("gpu002", 5, 48, 1)
    f.nodes["gpu007"].hidden_gpus = {5}
    f.xid("gpu011", 1, 13, 1)  # grows, not a quarantine XID: flagged, no finding
    before = r.state
    res = r.tick()
    assert res.sensed is not None and res.sensed.flagged == ("gpu002", "gpu007", "gpu011")
    obs = f.observe(res.now)
    qp = r.params.quarantine
    found = quarantine.find_fatal(obs, res.sensed, before, qp)
    assert found == quarantine.find_fatal(obs, replace(res.sensed, flagged=None), before, qp)
    assert sorted(x.node for x in found) == ["gpu002", "gpu007"]


def test_a_driver_recovery_request_quarantines_the_node_once_and_names_it():
    """NVIDIA's Xid catalog, XID 154: follow the recovery action the driver requests
    (DCGM_FI_DEV_GPU_RECOVERY_ACTION). A GPU reset asked for is the GPU's fault: only the jobs on it go."""
    from slurm_fleetyield.core.model import JobView
    from slurm_fleetyield.core.signals import RECOVERY_ACTION

    f = Fleet(20)
    f.jobs += [
        JobView(41, "RUNNING", ("gpu003",), True, gpus=1, gpu_index=(("gpu003", (2,)),)),
        JobView(42, "RUNNING", ("gpu003",), True, gpus=1, gpu_index=(("gpu003", (5,)),)),
    ]
    f.set("gpu003", 2, RECOVERY_ACTION, 1)
    r = Runner(f)
    (d,) = r.tick().plan.of_kind("drain")
    assert d.node == "gpu003" and d.reason == "fleetyield: GPU 2 driver requests GPU reset", d
    assert d.requeue_jobs == (41,)
    assert r.tick().plan.of_kind("drain") == ()  # the same request again: already acted on


def test_recovery_requests_none_unknown_or_elsewhere_and_the_off_switch_drain_nothing():
    from slurm_fleetyield.core.signals import RECOVERY_ACTION

    # 0 none; 5 recover the multi-node NVLink (IMEX) domain: not this node's; 99 unknown to this version
    for action in (0, 5, 99):
        f = Fleet(20)
        f.set("gpu003", 2, RECOVERY_ACTION, action)
        assert Runner(f).tick().plan.of_kind("drain") == (), action
    f = Fleet(20)
    f.set("gpu003", 2, RECOVERY_ACTION, 2)
    p = Params.model_validate({"quarantine": {"recovery_action_quarantines": False}})
    assert Runner(f, p).tick().plan.of_kind("drain") == ()
    (d,) = Runner(f).tick().plan.of_kind("drain")
    assert d.reason == "fleetyield: GPU 2 driver requests node reboot"
