"""`pcc run` end to end, and that changing the contract changes what executes."""

from __future__ import annotations

import json
import sys

import pytest
from runtime_helpers import CONTRACTS, plan, small

from pcc.cli import main as pcc_main
from pcc.runtime.contract import ContractError, compile_for_runtime
from pcc.runtime.experiment import trainer_variants
from pcc.runtime.loop import InjectedCrash, Run
from pcc.runtime.session import execute
from pcc.runtime.warmstart import held_out, quality


@pytest.mark.slow
def test_reward_rises_over_a_short_run():
    run = Run(plan("tiny_cpu", None), small(steps=12, prompts=32, group=8), None)
    held = held_out(run.task, 128)
    before = quality(run.arch, run.trainer.weights(), run.task, held)["exact"]
    r = [run.step(s)["reward"] for s in range(12)]
    after = quality(run.arch, run.trainer.weights(), run.task, held)["exact"]
    # Judged on held-out prompts by the trainer's expected exact match (deterministic): the sampled reward
    # of 12 steps of 256 samples moves by +-0.02 from step to step, as much as RL gains in 12 steps (the
    # old `last 4 > first 4 + 0.02` failed for seed 1). Measured with this configuration over seeds 0-3:
    # +0.08 to +0.19 (from 0.30-0.32), so +0.03 leaves 2.5x margin on the smallest.
    assert after > before + 0.03, (before, after)
    # The warm start sometimes succeeds, so RL has a signal: sampled step-0 reward 0.77-0.84 over seeds
    # 0-5 (held-out expected exact match 0.3 at BF16, through the FP8 rollout; bench/runtime.py
    # --warm-start); 0.6 is > 8 sigma of the step-to-step sampling noise (~0.02) below the lowest.
    assert 0.6 < r[0] < 0.97


def test_cli_run_writes_the_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    try:
        import matplotlib  # noqa: F401
        plots = []
    except ImportError:
        plots = ["--no-plots"]
    assert pcc_main(["run", str(CONTRACTS / "tiny_cpu.prec"), "--steps", "2", "--prompts", "4", "--group", "4",
                     "--out", str(out), "--json", *plots]) == 0
    summary = json.loads(capsys.readouterr().out)["result"]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and summary["steps"] == 2
    m = json.loads(lines[0])
    for key in ("reward", "entropy", "same_version_abs_dlogp_p99", "same_version_abs_dlogp_by_position",
                "trainer_rollout_kl", "reference_kl", "tis_clip_frac", "route_agreement_by_layer", "version_age"):
        assert key in m
    assert set(m["time"]) == {"activate", "rollout", "rescore", "train", "convert", "transfer", "checkpoint"}
    assert (out / "summary.json").is_file() and (out / "model" / "model.safetensors").is_file()
    assert {e["expect"] for e in summary["expectations"]} == {"same_version abs_dlogp p99 <= 0.05",
                                                              "route_agreement >= 0.98"}
    if not plots:
        assert (out / "reward.png").is_file()


def test_plots_without_matplotlib_fail_before_running(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert pcc_main(["run", str(CONTRACTS / "tiny_cpu.prec"), "--steps", "1", "--out", str(tmp_path / "r")]) == 1
    assert "pip install 'matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_resume_after_a_crash_continues_from_the_last_completed_step(tmp_path):
    c = compile_for_runtime(str(CONTRACTS / "tiny_cpu.prec"))
    with pytest.raises(InjectedCrash):
        execute(c, small(steps=4, crash_at=2), tmp_path / "a", plots=False, progress=False)
    assert len((tmp_path / "a" / "metrics.jsonl").read_text().splitlines()) == 2
    resumed = execute(c, small(steps=4), tmp_path / "a", resume=True, plots=False, progress=False)
    straight = execute(c, small(steps=4), tmp_path / "b", plots=False, progress=False)
    a = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in a] == [0, 1, 2, 3] and resumed["steps"] == 4
    assert [m["reward"] for m in a] == [m["reward"] for m in b]  # the same run, interrupted or not
    assert [m["version"] for m in a] == [0, 1, 2, 3] and straight["status"] == "ok"


def test_forward_qdq_trainer_matches_an_fp8_rollout_better_than_bf16():
    # same rollout (block FP8); miles_mode1 trains in BF16, unified_fp8_fake_fwd QDQs its FProp
    bf16 = Run(plan("miles_mode1"), small(steps=1, prompts=16), None).step(0)
    qdq = Run(plan("unified_fp8_fake_fwd"), small(steps=1, prompts=16), None).step(0)
    # measured with this configuration over seeds 0-3: qdq/bf16 mean 0.000-0.018, p99 <= 0.006 against
    # 0.16-0.32; 0.2 is 10x the worst
    assert qdq["same_version_abs_dlogp_mean"] < 0.2 * bf16["same_version_abs_dlogp_mean"]
    assert qdq["same_version_abs_dlogp_p99"] < bf16["same_version_abs_dlogp_p99"]


def test_routing_replay_makes_trainer_routes_equal_the_rollouts(tmp_path):
    child = tmp_path / "no_replay.prec"
    child.write_text(f'contract no-replay extends "{CONTRACTS / "miles_mode1.prec"}" {{\n  routing replay none\n}}\n')
    with_replay = Run(plan("miles_mode1"), small(steps=1, prompts=16), None).step(0)
    without = Run(compile_for_runtime(str(child), "tiny_moe").plan, small(steps=1, prompts=16), None).step(0)
    assert with_replay["routes_used_agreement"] == 1.0
    assert without["routes_used_agreement"] == without["route_agreement"] < 1.0  # FP8 flips some routes
    assert without["route_first_differing_layer"] is not None


def test_trainer_variants_reproduce_table5():
    res = trainer_variants(plan("unified_fp8"), small(steps=1, prompts=8))
    f = res["finding"]
    assert f["mismatch_lower"] and f["reference_kl_higher_step0"] and f["reproduced"]
    rows = {r["variant"]: r for r in res["variants"]}
    assert rows["fwd_qdq"]["abs_dlogp_mean"] < 0.2 * rows["bf16"]["abs_dlogp_mean"]  # measured 0.000-0.026, seeds 0-3


def test_bundle_directory_and_big_models(tmp_path):
    from pcc.bundle.write import write_bundle
    from pcc.lower import compile_file

    write_bundle(compile_file(str(CONTRACTS / "tiny_cpu.prec")).plan, tmp_path / "b", targets=("sglang",))
    assert compile_for_runtime(str(tmp_path / "b")).plan.catalog.name == "tiny_moe"
    (tmp_path / "b" / "contract.prec").write_text((CONTRACTS / "tiny_cpu.prec").read_text())  # edited: refused
    with pytest.raises(ContractError, match="does not match the manifest") as err:
        compile_for_runtime(str(tmp_path / "b"))
    assert err.value.code == "PCC706"
    with pytest.raises(ContractError, match=r"--model auto \(here tiny_moe\)"):
        compile_for_runtime(str(CONTRACTS / "unified_fp8.prec"))
    p = compile_for_runtime(str(CONTRACTS / "unified_fp8.prec"), "tiny_moe").plan
    assert p.catalog.name == "tiny_moe" and p.contract.hardware == "cpu"
