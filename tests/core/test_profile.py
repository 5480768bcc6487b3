from core.builders import A100_PCIE, H100, L40S, Fleet, Runner
from slurm_fleetyield.core import signals as s
from slurm_fleetyield.core.params import Params


def _env(f, node="gpu000", ticks=1, params=None):
    r = Runner(f, params)
    res = r.ticks(ticks)
    return res.nodes[node].envelope, res.nodes[node]


def test_premium_by_nvml_model_and_by_slurm_gpu_type():
    f = Fleet(0)
    f.add("a", H100)
    f.add("b", L40S)
    f.add("c", L40S, gpu_type="h200")
    res = Runner(f).tick()
    assert res.nodes["a"].envelope.premium and "fy_premium" in res.nodes["a"].fy_features
    assert not res.nodes["b"].envelope.premium and "fy_nonpremium" in res.nodes["b"].fy_features
    assert res.nodes["c"].envelope.premium


def test_premium_list_is_configurable():
    f = Fleet(1, model=L40S)
    p = Params.model_validate({"profile": {"premium_gpu_models": ["l40s"]}})
    env, _ = _env(f, params=p)
    assert env.premium


def test_pcie_board_has_no_nvlink_but_may_train():
    # No NVLink to degrade: the board keeps fy_ok_train (default, green-only work) but never fy_nvlink_full,
    # which gangs that need NVLink ask for explicitly.
    env, d = _env(Fleet(1, model=A100_PCIE))
    assert not env.nvlink and "fy_nvlink_full" not in d.fy_features and "fy_ok_train" in d.fy_features


def test_nvlink_crc_growth_removes_nvlink_full_and_ok_train():
    f = Fleet(2)
    r = Runner(f)
    first = r.tick()
    assert "fy_ok_train" in first.nodes["gpu000"].fy_features
    for _ in range(3):
        f.bump("gpu000", 6, s.NVLINK_CRC_FLIT, 10)
        f.bump("gpu000", 6, s.NVLINK_CRC_DATA, 10)
        res = r.tick()
    d = res.nodes["gpu000"]
    assert not d.envelope.nvlink_full
    assert "fy_nvlink_full" not in d.fy_features and "fy_ok_train" not in d.fy_features
    assert any("NVLink CRC" in n for n in d.envelope.notes)
    assert "fy_ok_train" in res.nodes["gpu001"].fy_features


def test_nvlink_replay_growth_removes_nvlink_full():
    f = Fleet(1)
    r = Runner(f)
    r.tick()
    f.bump("gpu000", 0, s.NVLINK_RECOVERY, 5)
    res = r.tick()
    assert not res.nodes["gpu000"].envelope.nvlink_full


def test_hbm_degradation_removes_hbm_full():
    for field, value in (
        (s.REMAP_PENDING, 1),
        (s.REMAP_FAILURE, 1),
        (s.ROWS_UNCORR, 2),
        (s.FB_TOTAL, 70_000),
    ):
        f = Fleet(1)
        f.set("gpu000", 3, field, value)
        env, d = _env(f)
        assert not env.hbm_full, field
        assert "fy_hbm_full" not in d.fy_features and "fy_ok_finetune" not in d.fy_features


def test_full_framebuffer_keeps_hbm_full():
    f = Fleet(1)
    f.set("gpu000", 3, s.FB_TOTAL, 81_559)
    env, _ = _env(f)
    assert env.hbm_full


def test_envelope_reads_only_the_gpu_type_of_the_slurm_row() -> None:
    """The loop profiles again only nodes whose SensedNode or Slurm GPU type changed (core/carry.py
    ``profile``): every other field of the Slurm row must leave the envelope as it was."""
    from dataclasses import fields, replace

    from slurm_fleetyield.core import profile
    from slurm_fleetyield.core.model import SlurmNode

    f = Fleet(0)
    f.add("a", H100)
    f.add("b", L40S, gpu_type="h200")
    f.add("c", L40S)
    r = Runner(f)
    res = r.tick()
    sensed, pp, obs = res.sensed, r.params.profile, f.observe(r.now)
    assert sensed is not None
    want = profile.profile(sensed, obs, pp)
    other = {
        "states": frozenset({"ALLOCATED", "DRAIN"}),
        "reason": "admin: cabling",
        "available_features": ("x",),
        "active_features": ("x",),
        "weight": 77,
        "gpu_count": 3,
        "partitions": ("debug",),
        "boot_time": 1.0,
    }
    assert {fl.name for fl in fields(SlurmNode)} == {"name", "gpu_type", *other}, "a new field: decide here"
    for name_, value in other.items():
        moved = {n: replace(row, **{name_: value}) for n, row in obs.slurm.items()}
        assert profile.profile(sensed, replace(obs, slurm=moved), pp) == want, name_
    retyped = {n: replace(row, gpu_type="h100") for n, row in obs.slurm.items()}
    assert profile.profile(sensed, replace(obs, slurm=retyped), pp)["c"] != want["c"]  # L40S -> premium type
