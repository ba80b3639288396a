"""Synchronization: converter bytes, atomic activation under faults, adapter-only sync, async staleness."""

from __future__ import annotations

import glob

import pytest
import torch
from runtime_helpers import plan, small

from pcc.cli import main as pcc_main
from pcc.runtime.checkpoint import load_tensors, save_model
from pcc.runtime.loop import Run
from pcc.runtime.session import execute
from pcc.runtime.contract import compile_for_runtime
from pcc.runtime.sync import Fault, SyncError, checksum


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and \
        a.contiguous().reshape(-1).view(torch.uint8).equal(b.contiguous().reshape(-1).view(torch.uint8))


def test_rollout_weights_are_byte_identical_to_pcc_convert(tmp_path):
    p = plan("tiny_cpu", None)
    run = Run(p, small(), None)
    run.step(0)  # version 1 is what the trainer holds now; convert its weights both ways
    save_model(tmp_path / "src", run.trainer.weights(), p.catalog.config)
    assert pcc_main(["convert", "contracts/tiny_cpu.prec", "--from", str(tmp_path / "src"),
                     "--to", str(tmp_path / "dst")]) == 0
    converted = {}
    for f in glob.glob(str(tmp_path / "dst" / "*.safetensors")):
        converted.update(load_tensors(f))
    assert all(t.dtype == torch.bfloat16 for t in run.pending[-1].received.values())  # the BF16 bridge
    run._activate({})  # the rollout installs version 1, rebuilding its block-FP8 policy
    installed = run.rollout.active.tensors
    assert run.rollout.active.version == 1 and set(installed) == set(converted)
    assert any(t.dtype == torch.float8_e4m3fn for t in installed.values())
    assert all(_same_bytes(installed[k], converted[k]) for k in installed)


@pytest.mark.parametrize("kind", ["drop", "corrupt"])
def test_damaged_transfer_is_refused_and_previous_version_stays(kind):
    p = plan("tiny_cpu", None)
    name = {"drop": "model.layers.2.self_attn.o_proj.weight",
            "corrupt": "model.layers.1.mlp.experts.3.down_proj.weight"}[kind]
    run = Run(p, small(fault=Fault(1, kind, name)), None)
    before = run.rollout.active
    sums = {k: checksum(t) for k, t in before.tensors.items()}
    run.step(0)
    with pytest.raises(SyncError, match=name.replace(".", r"\.")):
        run.step(1)
    after = run.rollout.active
    assert after is before and after.version == 0
    assert {k: checksum(t) for k, t in after.tensors.items()} == sums  # whole, not half-installed
    wire = {k: m["sha256"] for k, m in after.manifest["tensors"].items()}
    assert {k: checksum(t) for k, t in after.wire.items()} == wire


def test_refused_activation_is_reported_by_the_run(tmp_path):
    c = compile_for_runtime("contracts/tiny_cpu.prec")
    cfg = small(steps=3, fault=Fault(1, "corrupt", "lm_head.weight"))
    s = execute(c, cfg, tmp_path / "run", plots=False, progress=False)
    assert s["status"] == "failed" and "lm_head.weight" in s["error"] and "checksum" in s["error"]
    assert s["steps"] == 1 and s["rollout_version"] == 0


def test_lora_moves_only_adapter_bytes_and_leaves_the_base_untouched():
    p = plan("qwen38_nvfp4_lora")
    run = Run(p, small(steps=3), None)
    base = {k: checksum(t) for k, t in run.rollout.active.tensors.items() if ".lora_" not in k}
    trainer_base = {k: v.clone() for k, v in run.trainer.params.items()}
    adapter_bytes = sum(t.numel() * 2 for t in run.trainer.adapters.values())  # BF16 on the wire
    for s in range(3):
        m = run.step(s)
        assert m["sync_moves"] == "adapter" and m["sync_bytes"] == adapter_bytes
        assert all(".lora_" in k for k in run.pending[-1].received)
    run._activate({})
    act = run.rollout.active
    assert act.version == 3
    assert {k: checksum(t) for k, t in act.tensors.items() if ".lora_" not in k} == base
    assert all(torch.equal(run.trainer.params[k], v) for k, v in trainer_base.items())
    moved = [k for k in run.trainer.adapters if k.endswith("lora_B.weight")]
    assert any(run.trainer.adapters[k].abs().sum() > 0 for k in moved)  # the adapter did train
    for k, v in run.trainer.adapters.items():  # and the rollout serves exactly the trainer's adapter
        assert _same_bytes(act.tensors[k], v.detach().to(torch.bfloat16))
    assert any(t.dtype == torch.uint8 for k, t in act.tensors.items() if "experts" in k)  # NVFP4 base


def test_async_respects_staleness_and_reports_both_terms():
    p = plan("glm52_fp8_rollout")
    bound = p.contract.sync.max_staleness
    run = Run(p, small(steps=5), None)
    ms = [run.step(s) for s in range(5)]
    ages = [m["version_age"] for m in ms]
    assert max(ages) == bound and all(a <= bound for a in ages)
    for m in ms:
        assert len(m["versions_in_batch"]) == 1  # no trajectory mixes versions
        assert "same_version_abs_dlogp_mean" in m and "staleness_abs_dlogp_mean" in m
        if m["version_age"] == 0:
            assert m["staleness_abs_dlogp_mean"] == 0.0
        else:
            assert m["staleness_abs_dlogp_mean"] > 0.0
            assert m["rollout_version"] == m["version"] - m["version_age"]
