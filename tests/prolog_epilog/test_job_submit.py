"""job_submit.lua driven by a small Lua harness.

The harness is a test driver for the plugin's two functions: it provides only what
they use of slurmctld's ``slurm`` table (SUCCESS/ERROR, log_info, log_user, with
Slurm's printf-style formatting) and plain tables for job_desc/job_rec. It is not a fake
Slurm: whether slurmctld accepts the resulting constraint strings is checked later on
the docker Slurm cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parents[2] / "prolog_epilog" / "job_submit.lua"
LUA = next((p for p in map(shutil.which, ("lua5.3", "lua5.4", "lua")) if p), None)

pytestmark = pytest.mark.skipif(
    LUA is None, reason="no Lua interpreter (apt-get install -y --no-install-recommends lua5.3)"
)

HARNESS = r"""
local NIL = "\0nil"
slurm = { SUCCESS = 0, ERROR = -1 }
function slurm.log_info(fmt, ...) io.stderr:write("INFO " .. string.format(fmt, ...) .. "\n") end
function slurm.log_user(fmt, ...) io.stdout:write("USER " .. string.format(fmt, ...) .. "\n") end

local plugin, mode = arg[1], arg[2]
local loaded = dofile(plugin)
assert(loaded == slurm.SUCCESS, "plugin must return slurm.SUCCESS when loaded")

local job_desc, job_rec = {}, {}
for i = 3, #arg do
   local key, value = string.match(arg[i], "^([%w_.]+)=(.*)$")
   local target = job_desc
   if string.sub(key, 1, 4) == "rec." then
      target, key = job_rec, string.sub(key, 5)
   end
   target[key] = value
end

local rc
if mode == "submit" then
   rc = slurm_job_submit(job_desc, {}, tonumber(job_desc.uid or "1000"))
else
   rc = slurm_job_modify(job_desc, job_rec, {}, tonumber(job_desc.uid or "1000"))
end
io.stdout:write("RC " .. tostring(rc) .. "\n")
io.stdout:write("FEATURES " .. (job_desc.features == nil and NIL or job_desc.features) .. "\n")
"""


@dataclass
class Result:
    rc: int
    features: str | None
    user_msg: str
    log: str


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lua") / "harness.lua"
    path.write_text(HARNESS)
    return path


@pytest.fixture
def run_lua(harness: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    def run(mode: str = "submit", env: dict[str, str] | None = None, **fields: str) -> Result:
        full_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            # point the kill switch at a temp path so the host's /etc never matters
            "FLEETYIELD_JOB_SUBMIT_DISABLED_FILE": str(tmp_path / "fleetyield.disabled"),
        }
        full_env.update(env or {})
        args = [f"{k.replace('__', '.')}={v}" for k, v in fields.items()]
        proc = subprocess.run(
            [str(LUA), str(harness), str(PLUGIN), mode, *args],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=10,
        )
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout.splitlines()
        rc = int(next(line for line in out if line.startswith("RC "))[3:])
        feats = next(line for line in out if line.startswith("FEATURES "))[9:]
        user = "\n".join(line[5:] for line in out if line.startswith("USER "))
        return Result(rc, None if feats == "\0nil" else feats, user, proc.stderr)

    return run


@pytest.mark.parametrize(
    ("comment", "feature"),
    [
        ("fy:decode", "fy_ok_decode"),
        ("fy:batch", "fy_ok_batch"),
        ("fy:finetune", "fy_ok_finetune"),
        ("fy:pretrain", "fy_ok_train"),
        ("FY:Decode", "fy_ok_decode"),
        ("ticket 12, fy:batch; owner bob", "fy_ok_batch"),
    ],
)
def test_declared_class_sets_feature(run_lua, comment: str, feature: str) -> None:  # type: ignore[no-untyped-def]
    res = run_lua(comment=comment)
    assert res.rc == 0
    assert res.features == feature
    assert "fleetyield:" in res.log


def test_undeclared_job_is_green_only(run_lua) -> None:  # type: ignore[no-untyped-def]
    res = run_lua()
    assert (res.rc, res.features) == (0, "fy_ok_train")
    res = run_lua(comment="just a note")
    assert (res.rc, res.features) == (0, "fy_ok_train")


def test_class_from_partition_then_qos(run_lua) -> None:  # type: ignore[no-untyped-def]
    assert run_lua(partition="decode").features == "fy_ok_decode"
    assert run_lua(partition="Batch,other").features == "fy_ok_batch"
    assert run_lua(partition="gpu", qos="finetune").features == "fy_ok_finetune"
    assert run_lua(partition="gpu", qos="normal").features == "fy_ok_train"
    # the comment wins over the partition
    assert run_lua(partition="batch", comment="fy:decode").features == "fy_ok_decode"


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ("h100", "h100&fy_ok_train"),
        ("h100&ib", "h100&ib&fy_ok_train"),
        ("h100|a100", "(h100|a100)&fy_ok_train"),
        ("[rack1|rack2]", "[rack1|rack2]&fy_ok_train"),
        ("(a|b)&c", "(a|b)&c&fy_ok_train"),
        ("   ", "fy_ok_train"),
    ],
)
def test_user_constraint_preserved(run_lua, user: str, expected: str) -> None:  # type: ignore[no-untyped-def]
    res = run_lua(features=user)
    assert (res.rc, res.features) == (0, expected)


def test_unnestable_constraint_left_alone(run_lua) -> None:  # type: ignore[no-untyped-def]
    res = run_lua(features="[a|b]|c")
    assert res.rc == 0
    assert res.features == "[a|b]|c"
    assert "left ungated" in res.log


def test_unknown_class_rejected(run_lua) -> None:  # type: ignore[no-untyped-def]
    res = run_lua(comment="fy:inference", features="h100")
    assert res.rc == -1
    assert "unknown workload class 'fy:inference'" in res.user_msg
    assert res.features == "h100"  # untouched
    assert run_lua(comment="fy:").rc == -1
    assert run_lua(comment="fy:default").rc == -1


def test_canary_adds_nothing_for_controller(run_lua) -> None:  # type: ignore[no-untyped-def]
    res = run_lua(comment="fy:canary", features="fy_canary", uid="0")
    assert (res.rc, res.features) == (0, "fy_canary")
    res = run_lua(
        comment="fy:canary", features="fy_canary", uid="990", env={"FLEETYIELD_CANARY_UIDS": "0,990"}
    )
    assert (res.rc, res.features) == (0, "fy_canary")


def test_canary_from_a_user_is_gated_like_default(run_lua) -> None:  # type: ignore[no-untyped-def]
    res = run_lua(comment="fy:canary", uid="1000")
    assert (res.rc, res.features) == (0, "fy_ok_train")
    assert "reserved for the FleetYield controller" in res.user_msg


def test_kill_switch_file(run_lua, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "fleetyield.disabled").touch()
    res = run_lua(comment="fy:decode", features="h100")
    assert (res.rc, res.features) == (0, "h100")
    assert "kill switch" in res.log
    # even an unknown class is not rejected while FleetYield is switched off
    assert run_lua(comment="fy:nope").rc == 0


def test_kill_switch_env(run_lua) -> None:  # type: ignore[no-untyped-def]
    res = run_lua(comment="fy:decode", env={"FLEETYIELD_JOB_SUBMIT": "off"})
    assert (res.rc, res.features) == (0, None)


def test_user_comment_with_percent_is_logged_safely(run_lua) -> None:  # type: ignore[no-untyped-def]
    res = run_lua(comment="fy:bad%s%d")
    assert res.rc == -1
    assert "fy:bad%s%d" in res.user_msg


def test_modify_without_relevant_fields_is_noop(run_lua) -> None:  # type: ignore[no-untyped-def]
    res = run_lua("modify", time_limit="60", rec__comment="fy:decode", rec__features="fy_ok_decode")
    assert (res.rc, res.features) == (0, None)


def test_modify_comment_reclassifies_existing_constraint(run_lua) -> None:  # type: ignore[no-untyped-def]
    res = run_lua("modify", comment="fy:batch", rec__features="(h100|a100)&fy_ok_decode")
    assert (res.rc, res.features) == (0, "(h100|a100)&fy_ok_batch")


def test_modify_features_keeps_class_and_never_stacks(run_lua) -> None:  # type: ignore[no-untyped-def]
    res = run_lua("modify", features="a100", rec__comment="fy:decode", rec__features="h100&fy_ok_decode")
    assert (res.rc, res.features) == (0, "a100&fy_ok_decode")
    # a constraint that already carries our feature is not doubled
    res = run_lua("modify", features="a100&fy_ok_decode", rec__comment="fy:decode")
    assert (res.rc, res.features) == (0, "a100&fy_ok_decode")


def test_modify_partition_uses_record_comment_first(run_lua) -> None:  # type: ignore[no-untyped-def]
    res = run_lua("modify", partition="batch", rec__comment="fy:finetune", rec__features="fy_ok_finetune")
    assert (res.rc, res.features) == (0, "fy_ok_finetune")
    res = run_lua("modify", partition="batch", rec__features="fy_ok_train")
    assert (res.rc, res.features) == (0, "fy_ok_batch")


def test_modify_to_unknown_class_rejected(run_lua) -> None:  # type: ignore[no-untyped-def]
    res = run_lua("modify", comment="fy:wat", rec__features="fy_ok_train")
    assert res.rc == -1


def test_modify_to_canary_clears_feature_for_controller(run_lua) -> None:  # type: ignore[no-untyped-def]
    res = run_lua("modify", comment="fy:canary", uid="0", rec__features="fy_canary&fy_ok_train")
    assert (res.rc, res.features) == (0, "fy_canary")


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # issue #27 item 11: --constraint=fy_ok_decode without a class became Features=fy_ok_train
        ({"features": "fy_ok_decode"}, "fy_ok_decode&fy_ok_train"),
        ({"features": "h100&fy_ok_decode"}, "h100&fy_ok_decode&fy_ok_train"),
        ({"features": "fy_ok_batch", "comment": "fy:decode"}, "fy_ok_batch&fy_ok_decode"),
        # the class's own feature is not added twice
        ({"features": "fy_ok_decode", "comment": "fy:decode"}, "fy_ok_decode"),
        ({"features": "fy_ok_train&h100"}, "fy_ok_train&h100"),
        ({"features": "h100,fy_ok_train"}, "h100,fy_ok_train"),
        # inside an OR it is no guarantee: the class feature is still ANDed
        ({"features": "h100|fy_ok_train"}, "(h100|fy_ok_train)&fy_ok_train"),
    ],
)
def test_user_fy_terms_are_kept_and_never_duplicated(run_lua, fields, expected) -> None:  # type: ignore[no-untyped-def]
    res = run_lua(**fields)
    assert (res.rc, res.features) == (0, expected)


def test_modify_keeps_the_users_fy_term_under_the_appended_one(run_lua) -> None:  # type: ignore[no-untyped-def]
    # stored constraint: the user's fy_ok_decode, then the fy_ok_train the plugin appended at submit
    res = run_lua("modify", partition="batch", rec__features="fy_ok_decode&fy_ok_train")
    assert (res.rc, res.features) == (0, "fy_ok_decode&fy_ok_batch")
    # a new constraint given in the modify is the user's: nothing of it is stripped
    res = run_lua("modify", features="fy_ok_decode", rec__features="fy_ok_train")
    assert (res.rc, res.features) == (0, "fy_ok_decode&fy_ok_train")


SPARES_ENV = {"FLEETYIELD_GANG_MIN_NODES": "2", "FLEETYIELD_PREEMPTIBLE_QOS": "fy_preemptible, Scavenger"}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # a multi-node train job is a gang: it may restart on a hot spare
        ({"min_nodes": "2"}, "fy_ok_gang"),
        ({"min_nodes": "16", "comment": "fy:pretrain", "features": "h100"}, "h100&fy_ok_gang"),
        ({"min_nodes": "1"}, "fy_ok_train"),
        # NO_VAL: no node count given, not recognised as a gang
        ({"min_nodes": "4294967294"}, "fy_ok_train"),
        # only train work is a gang; other classes keep their feature whatever their size
        ({"min_nodes": "4", "comment": "fy:finetune"}, "fy_ok_finetune"),
        # the preemptible QOS wins over the class, gang or not (case-insensitive)
        ({"qos": "fy_preemptible", "comment": "fy:finetune"}, "fy_ok_preempt"),
        ({"qos": "scavenger", "min_nodes": "2"}, "fy_ok_preempt"),
        ({"qos": "normal", "comment": "fy:batch"}, "fy_ok_batch"),
        # canaries stay ungated by class
        ({"qos": "fy_preemptible", "comment": "fy:canary", "uid": "0"}, None),
    ],
)
def test_hot_spare_classes(run_lua, fields, expected) -> None:  # type: ignore[no-untyped-def]
    res = run_lua(env=SPARES_ENV, **fields)
    assert (res.rc, res.features) == (0, expected)


def test_hot_spare_classes_are_off_by_default(run_lua) -> None:  # type: ignore[no-untyped-def]
    assert run_lua(min_nodes="8").features == "fy_ok_train"
    assert run_lua(qos="fy_preemptible", comment="fy:batch").features == "fy_ok_batch"
    assert run_lua(env={"FLEETYIELD_GANG_MIN_NODES": "junk"}, min_nodes="8").features == "fy_ok_train"


def test_modify_regates_a_job_that_becomes_a_gang(run_lua) -> None:  # type: ignore[no-untyped-def]
    # the node count changes in the modify: the appended fy_ok_train becomes fy_ok_gang
    res = run_lua(
        "modify", env=SPARES_ENV, min_nodes="4", rec__features="h100&fy_ok_train", rec__min_nodes="1"
    )
    assert (res.rc, res.features) == (0, "h100&fy_ok_gang")
    # NO_VAL in the modify (not changed) with nothing else changed: left alone
    res = run_lua("modify", env=SPARES_ENV, min_nodes="4294967294", rec__features="fy_ok_train")
    assert (res.rc, res.features) == (0, None)
    # a QOS change to the preemptible one, the stored node count kept
    res = run_lua(
        "modify", env=SPARES_ENV, qos="fy_preemptible", rec__features="fy_ok_gang", rec__min_nodes="4"
    )
    assert (res.rc, res.features) == (0, "fy_ok_preempt")
    # a QOS change away from it, a gang by its stored node count
    res = run_lua("modify", env=SPARES_ENV, qos="normal", rec__features="fy_ok_preempt", rec__min_nodes="4")
    assert (res.rc, res.features) == (0, "fy_ok_gang")
