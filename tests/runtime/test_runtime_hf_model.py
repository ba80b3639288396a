"""The runtime's policy built with transformers' own modeling code (pcc/runtime/hf_model.py).

References: transformers' own forward of the same checkpoint (fused experts loaded the way
transformers loads them) for the architecture, and a hand-worked torch.float8_e4m3fn
quantization for the per-GEMM precision swapped into it."""

from __future__ import annotations

import math

import pytest
import torch
from runtime_helpers import plan, small

import pcc.runtime.model as M
from pcc.models import load_catalog
from pcc.runtime.model import Arch, KVCache, init_weights, model_code
from pcc.runtime.session import set_threads
from pcc.runtime.settings import SettingError

transformers = pytest.importorskip("transformers")
H = pytest.importorskip("pcc.runtime.hf_model")
if H.unavailable():
    pytest.skip(H.unavailable(), allow_module_level=True)

STAND_INS = {"tiny_moe": "Qwen3MoeForCausalLM", "tiny_dense": "LlamaForCausalLM",
             "tiny_shared_moe": "DeepseekV3ForCausalLM"}


class FP32:
    """Unrounded FP32 GEMMs over float32 weights: the execution transformers' own FP32 forward is."""

    def __init__(self, w):
        self.w = w

    def linear(self, name, x):
        return x @ self.w[name].t()

    def weight(self, name):
        return self.w[name]

    def kv(self, layer, k, v):
        return k, v


def _weights(arch: Arch, seed: int = 1) -> dict[str, torch.Tensor]:
    """Initial weights made larger (and norms not all one) so that routing and attention are far from uniform."""
    g = torch.Generator().manual_seed(seed)
    return {k: v * 5 if v.dim() == 2 else v + 0.1 * torch.randn(v.shape, generator=g)
            for k, v in init_weights(arch, seed).items()}


def _transformers_model(cat, arch: Arch, w: dict):
    """transformers' model from the catalog's config, its checkpoint loaded as transformers 5 stores it
    (experts fused: gate rows then up rows)."""
    cfg = {k: v for k, v in cat.config.items() if not k.startswith("_")}
    hc = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = transformers.AutoModelForCausalLM.from_config(hc, attn_implementation="eager").float().eval()
    state = {k: v for k, v in w.items() if ".experts." not in k or ".shared_experts." in k} | arch.buffers()
    for i in [i for i in range(arch.layers) if arch.moe_layer(i)]:
        p = f"model.layers.{i}.mlp.experts."
        state[p + "gate_up_proj"] = torch.stack([torch.cat([w[f"{p}{e}.gate_proj.weight"], w[f"{p}{e}.up_proj.weight"]])
                                                 for e in range(arch.experts)])
        state[p + "down_proj"] = torch.stack([w[f"{p}{e}.down_proj.weight"] for e in range(arch.experts)])
    model.load_state_dict(state, strict=True)
    return model


def test_the_switch():
    assert model_code() == "transformers"  # transformers >= 5 is installed here
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PCC_MODEL_CODE", "pcc")
        assert model_code() == "pcc"
        mp.setenv("PCC_MODEL_CODE", "jax")
        with pytest.raises(SettingError, match="PCC_MODEL_CODE"):
            model_code()
        with pytest.raises(SettingError, match="PCC_MODEL_CODE"):
            set_threads()  # what pcc run / validate / experiment call before anything runs
        mp.setattr(H, "unavailable", lambda: "transformers 4.57.0 is older than 5.0")
        mp.setenv("PCC_MODEL_CODE", "transformers")
        with pytest.raises(SettingError, match="older than 5.0"):
            model_code()
        mp.delenv("PCC_MODEL_CODE")
        assert model_code() == "pcc"  # the default falls back to the hand-written model


@pytest.mark.parametrize("name", sorted(STAND_INS))
def test_logits_equal_transformers_and_the_hand_written_model(name, monkeypatch):
    cat = load_catalog(name)
    arch = Arch.from_catalog(cat)
    built = H.build(arch)
    assert type(built.model).__name__ == STAND_INS[name]
    w = _weights(arch)
    toks = torch.randint(0, arch.vocab, (4, 12), generator=torch.Generator().manual_seed(2))
    mine, routes = H.forward(arch, FP32(w), toks)
    with torch.no_grad():
        ref = _transformers_model(cat, arch, w)(toks).logits
    scale = float(ref.abs().max())
    assert scale > 1.0  # logits far from zero: a tolerance relative to them means something
    assert float((mine - ref).abs().max()) < 1e-5 * scale
    # the hand-written model, its BF16 rounding between kernels turned off, is the same function
    monkeypatch.setattr(M, "bf16", lambda t: t)
    hand, hand_routes = M.pcc_forward(arch, FP32(w), toks)
    assert float((mine - hand).abs().max()) < 1e-5 * scale
    assert len(routes.used) == sum(arch.moe_layer(i) for i in range(arch.layers))
    assert all(torch.equal(a, b) for a, b in zip(routes.used, hand_routes.used))
    assert all(torch.equal(a, b) for a, b in zip(routes.own, hand_routes.own))


def test_routing_replay_forces_the_experts_and_keeps_the_router_s_weights():
    arch = Arch.from_catalog(load_catalog("tiny_moe"))
    w = _weights(arch)
    toks = torch.randint(0, arch.vocab, (2, 10), generator=torch.Generator().manual_seed(3))
    _, own = H.forward(arch, FP32(w), toks)
    forced = [(r + 1) % arch.experts for r in own.used]  # every token to other experts
    logits, routes = H.forward(arch, FP32(w), toks, replay=forced)
    assert all(torch.equal(a, b) for a, b in zip(routes.used, forced))
    assert torch.equal(routes.own[0], own.own[0])  # the first MoE layer's own choice is unchanged
    ref, _ = M.pcc_forward(arch, FP32(w), toks, replay=forced)  # rounding differs: BF16 between kernels
    assert float((torch.softmax(logits, -1) - torch.softmax(ref, -1)).abs().max()) < 0.05
    assert float((logits - H.forward(arch, FP32(w), toks)[0]).abs().max()) > 0.1  # replay changed the output


@pytest.mark.parametrize("name", ["tiny_moe", "tiny_shared_moe"])
def test_kv_cache_decode_equals_full_forward(name):
    arch = Arch.from_catalog(load_catalog(name))
    w = _weights(arch)
    toks = torch.randint(0, arch.vocab, (3, 12), generator=torch.Generator().manual_seed(4))
    full, _ = H.forward(arch, FP32(w), toks)
    cache, seen = KVCache(arch.layers), []

    class Recording(FP32):
        def kv(self, layer, k, v):
            seen.append((layer, tuple(k.shape), tuple(v.shape)))
            return k, v

    ex = Recording(w)
    parts = [H.forward(arch, ex, toks[:, :5], cache)[0]] + [H.forward(arch, ex, toks[:, t:t + 1], cache)[0]
                                                           for t in range(5, 12)]
    assert float((torch.cat(parts, 1) - full).abs().max()) < 1e-5 * float(full.abs().max())
    assert cache.length == 12 and len(seen) == 8 * arch.layers  # every layer's new entries went through ex.kv
    if arch.mla:  # the cache holds the normalized latent and the roped shared key, one "head", as SGLang's
        assert seen[0][1:] == ((3, 1, 5, arch.kv_rank), (3, 1, 5, arch.rope_dim))


def _fp8_qdq(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Hand-worked block FP8: per (rows x cols) block, scale amax / 448, values cast by torch to e4m3fn."""
    n, k = t.shape
    out = torch.empty_like(t)
    for i in range(0, n, rows):
        for j in range(0, k, cols):
            b = t[i:i + rows, j:j + cols]
            s = b.abs().max() / 448.0
            out[i:i + rows, j:j + cols] = (b / s).to(torch.float8_e4m3fn).float() * s
    return out


@pytest.mark.parametrize("variant", [None, "real"])  # the contract's FProp QDQ; the emulated real FP8 GEMM
def test_an_expert_gemm_is_the_hand_worked_block_fp8_matmul(variant):
    """unified_fp8_fake_fwd on tiny_moe: FProp of every linear at block FP8 (weights 128x128, activations
    1x128). The fused gate_up_proj of transformers is two GEMMs here, each with its own weight scales."""
    from pcc.runtime.trainer import Trainer

    p = plan("unified_fp8_fake_fwd")
    arch = Arch.from_catalog(p.catalog)
    w = _weights(arch)
    tr = Trainer(arch, p, w, lr=1e-3, variant=variant)
    seen, linear = {}, tr.linear

    def recording(name, x):
        y = linear(name, x)
        seen.setdefault(name, (x.detach().reshape(-1, x.shape[-1]), y.detach().reshape(-1, y.shape[-1])))
        return y

    tr.linear = recording
    toks = torch.randint(0, arch.vocab, (4, 10), generator=torch.Generator().manual_seed(5))
    tr.logprobs(toks, 6, 1.0)
    pre = "model.layers.1.mlp.experts."
    e = next(e for e in range(arch.experts) if pre + f"{e}.gate_proj.weight" in seen)
    errs = {}
    for part in ("gate_proj", "up_proj", "down_proj", ""):
        name = pre + f"{e}.{part}.weight" if part else "model.layers.1.self_attn.q_proj.weight"
        x, y = seen[name]
        wt = tr.params[name].detach()
        hand = M.bf16(_fp8_qdq(x, 1, 128) @ _fp8_qdq(wt, 128, 128).t())
        wide = M.bf16(M.bf16(x) @ M.bf16(wt).t())
        err = errs[part] = float((y - hand).abs().max())
        assert err <= 2 ** -7 * float(hand.abs().max()), (name, err)  # one BF16 ulp at the largest value
        assert float((y - wide).abs().max()) > 10 * max(err, 1e-9), name  # quantization is visible
    # gate and up quantized as separate scale groups: a fused [gate; up] 128x128 block would share one scale,
    # the larger amax of the two, and the matrix with the smaller amax would come out otherwise
    gate, up = (tr.params[pre + f"{e}.{m}.weight"].detach() for m in ("gate_proj", "up_proj"))
    assert gate.shape[0] + up.shape[0] <= 128 and float(gate.abs().max()) != float(up.abs().max())
    small_one = "gate_proj" if float(gate.abs().max()) < float(up.abs().max()) else "up_proj"
    x, y = seen[pre + f"{e}.{small_one}.weight"]
    fused = _fp8_qdq(torch.cat([gate, up]), 128, 128)
    fused = fused[:gate.shape[0]] if small_one == "gate_proj" else fused[gate.shape[0]:]
    d = float((y - M.bf16(_fp8_qdq(x, 1, 128) @ fused.t())).abs().max())
    assert d > 0.01 * float(y.abs().max()) and d > 10 * errs[small_one]  # a visible difference, not rounding


@pytest.mark.slow  # two warm starts from an empty cache
@pytest.mark.parametrize("contract,model,cls,gap", [
    # unified FP8: trainer and rollout run the same emulated block-FP8 GEMMs, through the same model code, but
    # the rollout decodes a token at a time from its KV cache and the trainer scores whole sequences: a decode
    # step's attention is a softmax and P.V over t+1 keys, the prefill's over T keys with the rest masked, and
    # those sum in another order (of 40 random rows, ATen's softmax differs on 3 with its AVX-512 kernels, 1 with
    # AVX2; P.V on 33). The rollout's own prefill of the same tokens gives the trainer's log-probs bit for bit;
    # its decode is 7.7e-5 apart at version 1 (p99 4e-3) with AVX-512 on one machine, 8.8e-9 with AVX2, and 0
    # at version 0 on both
    ("unified_fp8", "tiny_moe", "Qwen3MoeForCausalLM", (0.0, 1e-3)),
    # an FP8 rollout (and FP8 KV cache in the MLA latent) against a BF16 trainer: a gap (0.03 here), and a small one
    ("glm52_fp8_rollout", "tiny_shared_moe", "DeepseekV3ForCausalLM", (1e-3, 0.1))])
def test_pcc_run_trains_a_transformers_built_model_at_contract_precision(contract, model, cls, gap):
    from pcc.runtime.loop import Run

    run = Run(plan(contract, model), small(steps=2, prompts=8, group=4), None)
    assert type(H.build(run.arch).model).__name__ == cls
    before = {k: v.detach().clone() for k, v in run.trainer.master.items()}  # FP32 master: a BF16 norm weight of
    rows = [run.step(s) for s in range(2)]  # 1.0 does not move by 2 steps of lr 3e-4, its master does
    after = run.trainer.master
    assert run.trainer.version == 2
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    for part in (".experts.", "self_attn", "layernorm", "embed_tokens", "lm_head", "mlp.gate.weight"):
        assert any(part in k for k in moved), part  # gradients reach every kind of parameter
    for r in rows:
        assert 0.0 <= r["reward"] <= 1.0 and math.isfinite(r["same_version_abs_dlogp_mean"])
        assert gap[0] <= r["same_version_abs_dlogp_mean"] <= gap[1]


def test_two_threads_run_the_same_model_on_their_own_executions():
    """One built model per architecture serves every execution: forwards from two threads (an HTTP
    validation's worker beside the main loop) never mix their weights."""
    import threading

    arch = Arch.from_catalog(load_catalog("tiny_dense"))
    ws = [_weights(arch, 1), _weights(arch, 2)]
    toks = torch.randint(0, arch.vocab, (2, 8), generator=torch.Generator().manual_seed(6))
    alone = [H.forward(arch, FP32(w), toks)[0] for w in ws]
    out = {0: [], 1: []}

    def run(i):
        for _ in range(6):
            out[i].append(H.forward(arch, FP32(ws[i]), toks)[0])

    ts = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(torch.equal(y, alone[i]) for i in (0, 1) for y in out[i]) and len(out[0]) == len(out[1]) == 6
