"""Level 3, one operator: BF16 vs the QDQ reference vs the low-precision GEMM, on the model's
own weights and on activations captured from the fixed prefixes.

One operator per (rollout rule, family): the first that the fixed prefixes route tokens to. The QDQ reference is the scheme's reconstructed
operands in an FP32 GEMM; the low-precision path is pcc's block-scaled GEMM
(`pcc.numerics.scaled_gemm`, promoting per K-chunk) and, where the engine exposes it, the
engine's own kernel on its installed weights. Their gap to QDQ is kernel, layout or
accumulation error; QDQ's gap to BF16 is the quantization error the contract accepts.
"""

from __future__ import annotations

import torch

from pcc.numerics import quantize, scaled_gemm
from pcc.plan.encode import group_amax
from pcc.runtime.calibrate import quantize_static, static_targets
from pcc.runtime.model import bf16, forward
from pcc.runtime.precision import rollout_gemms

from . import Outcome, rel_err

LOOK = ["the operator with the largest kernel error: its scale layout (row- vs column-major, block shape)",
        "the kernel's accumulation: FP32 promotion per K-chunk (DeepGEMM promotes every 128 elements)",
        "transposes: which operand the kernel expects K-major",
        "the activation quantizer the engine runs (tile 1x128 vs per-token) against the scheme"]


class _Recorder:
    """An Exec that records the input of chosen operators while the trainer's forward runs."""

    def __init__(self, inner, names):
        self.inner, self.names, self.seen = inner, set(names), {}

    def linear(self, name, x):
        if name in self.names and name not in self.seen:
            self.seen[name] = x.detach().reshape(-1, x.shape[-1]).float().clone()
        return self.inner.linear(name, x)

    def weight(self, name):
        return self.inner.weight(name)

    def kv(self, layer, k, v):
        return self.inner.kv(layer, k, v)


def groups(plan, gemms) -> dict[tuple, list[int]]:
    """The operators the rollout quantizes, by (rollout rule, family)."""
    out: dict[tuple, list[int]] = {}
    for rid, idx in plan.groups["rollout"]:
        for i in idx:
            op = plan.catalog.operators[i]
            if op.family != "kv_cache" and gemms[op.tensor].scheme is not None:
                out.setdefault((rid, op.family), []).append(i)
    return out


@torch.no_grad()
def run(ctx) -> Outcome:
    o = Outcome(look=list(LOOK))
    plan, trainer = ctx.plan, ctx.runtime_trainer
    gemms = rollout_gemms(plan)
    by_group = groups(plan, gemms)
    if not by_group:
        o.figures["fake vs real relative error"] = 0.0
        o.findings.append("the rollout quantizes no operator: nothing to compare at this level")
        return o
    ops = plan.catalog.operators
    tokens, _ = ctx.fixed()
    rec = _Recorder(trainer, [ops[i].tensor for idx in by_group.values() for i in idx])
    forward(ctx.arch, rec, tokens[:, :-1])
    chosen = [next((i for i in idx if rec.seen.get(ops[i].tensor) is not None and len(rec.seen[ops[i].tensor])), None)
              for idx in by_group.values()]  # the first operator of each group that saw tokens
    chosen = [i for i in chosen if i is not None]
    kernel = getattr(ctx.engine, "kernel", None)
    disk = ctx.checkpoint_tensors()  # static activation scales as the engine loaded them (version 0)
    static = {op: disk[n].float() for op, n in static_targets(plan).items()}
    rows, worst = [], 0.0
    for i in chosen:
        name = ops[i].tensor
        x = rec.seen[name]
        g, w = gemms[name], trainer.params[name].detach()
        scale = static.get(name)
        y_bf16 = bf16(x) @ bf16(w).t()
        act = quantize_static(x, g.scheme, scale).dequantize(torch.float32) \
            if scale is not None and "activation" in g.roles else g.operand(x, "activation", name)
        # an NVFP4 scale group (gate and up) shares one global weight scale, from the group's amax, as the
        # converter writes it (weight_scale_2); the reference quantizes the weight as the engine holds it
        amax = group_amax(plan, i, lambda m: trainer.params[m].detach().float())
        w_ref = g.operand(w, "weight", name) if amax is None or "weight" not in g.roles else \
            quantize(w.float().contiguous(), g.scheme, "weight", name=name, amax=amax).dequantize(torch.float32)
        y_qdq = act @ w_ref.t()
        row = {"tensor": name, "family": ops[i].family, "scheme": plan.scheme_name("rollout", i), "mode": g.mode,
               "tokens": x.shape[0], "quantization_error": rel_err(y_qdq, y_bf16),
               "activation scale": "dynamic" if scale is None else f"static input_scale {float(scale):.4g}"}
        if g.mode == "real" and {"weight", "activation"} <= g.roles:
            qa = quantize(x.contiguous(), g.scheme, "activation", name=f"{name} activation") if scale is None \
                else quantize_static(x, g.scheme, scale)
            qb = quantize(w.float().contiguous(), g.scheme, "weight", name=name, amax=amax)
            row["emulated_kernel_error"] = rel_err(scaled_gemm(qa, qb), y_qdq)
        if kernel is not None:  # the engine's output dtype applies to its reference too
            ref = bf16(y_qdq) if g.output == "bf16" else y_qdq
            row["engine_kernel_error"] = rel_err(kernel(name, x), ref)
        errs = [row[k] for k in ("emulated_kernel_error", "engine_kernel_error") if k in row]
        worst = max([worst, *errs])
        rows.append(row)
    o.figures["operators"] = rows
    o.figures["fake vs real relative error"] = worst
    o.figures["engine kernel"] = "the engine's own" if kernel is not None else \
        "not reachable over this engine's API: pcc's emulated GEMM only"
    bad = max(rows, key=lambda r: max(r.get("emulated_kernel_error", 0), r.get("engine_kernel_error", 0)))
    emu, eng = bad.get("emulated_kernel_error"), bad.get("engine_kernel_error")
    if worst <= 1e-2:
        return o
    if eng is not None and emu is not None and eng > 10 * max(emu, 1e-6):
        o.findings.append(f"{bad['tensor']} ({bad['scheme']}): the engine's kernel is {eng:.2e} from the QDQ "
                          f"reference while pcc's block-scaled GEMM is {emu:.2e}: the engine's kernel accumulates "
                          "or lays out scales differently from the scheme")
    elif emu is not None and emu > 1e-2:
        o.findings.append(f"{bad['tensor']}: pcc's block-scaled GEMM is {emu:.2e} from QDQ: the scheme's "
                          "grouping does not factor out of the GEMM (scale layout or K-chunking)")
    return o
