"""Level 5, routes and request state.

Routes: the expert ids the rollout engine used against the ones the trainer's router picks on
the same tokens, per MoE layer, and the first layer where they differ. Because a wrong expert
changes the hidden state only after its own layer, the installed expert weights are read back
by name too, which names the layer whose packing is wrong.
Request state: the same long contexts (task episodes back to back) scored by one prefill and
by decoding through the engine's cache; |dlogp| by position shows drift as context grows.
"""

from __future__ import annotations

import torch

from pcc.runtime import diagnostics as D

from . import Outcome
from .common import LAYER, by_position, readback, score_both, unless_not_served

LOOK = ["the first layer whose installed expert weights differ: expert packing / EP shard mapping",
        "router inputs at the first layer whose expert ids differ (the hidden state entering it)",
        "decode vs prefill drift: KV-cache dtype and scale, recurrent or convolution state history",
        "routing replay: whether the trainer runs on the rollout's recorded experts"]


def long_contexts(ctx, rows: int = 8) -> torch.Tensor:
    gen = torch.Generator().manual_seed(ctx.cfg.seed * 31 + 5)
    return torch.cat([ctx.task.sequences(rows, gen) for _ in range(ctx.cfg.episodes)], 1)


def run(ctx) -> Outcome:
    o = Outcome(look=list(LOOK))
    tokens, p = ctx.fixed()
    mask = ctx.task.response_mask(tokens)
    _, s, own = score_both(ctx, tokens, p)
    if ctx.arch.is_moe:
        if s.routes is None:
            o.findings.append(f"the engine ({ctx.engine_spec}) did not report expert ids "
                              "(SGLang, vLLM: --enable-return-routed-experts)")
        else:
            ra = D.route_agreement(own, s.routes, p, mask)
            o.figures["route_agreement"] = ra["route_agreement"]
            o.figures["route_agreement_min"] = ra["route_agreement_min"]
            o.figures["route_first_differing_layer"] = ra["route_first_differing_layer"]
            o.data["route_agreement_by_layer"] = ra["route_agreement_by_layer"]
            if ra["route_first_differing_layer"] is not None:
                o.findings.append(f"expert ids first differ at layer {ra['route_first_differing_layer']}; "
                                  f"agreement by layer {ra['route_agreement_by_layer']}")
    wrong = unless_not_served(o, lambda: readback(ctx, ctx.checkpoint_tensors()))
    n_wrong = None if wrong is None else len(wrong)
    o.figures["installed tensors differing from the checkpoint"] = n_wrong
    if wrong:
        layer = int(LAYER.search(wrong[0]).group(1))
        o.figures["first layer with differing installed weights"] = layer
        o.findings.append(f"installed weights first differ at layer {layer}: "
                          + ", ".join(w for w in wrong if f".layers.{layer}." in w)[:400])
    o.check("installed tensors differing from the checkpoint", "==", 0, n_wrong,
            "what the kernels read is what was loaded, expert by expert")
    _request_state(ctx, o)
    return o


def _request_state(ctx, o: Outcome) -> None:
    from ..expect import thresholds

    seq = long_contexts(ctx)
    p = ctx.task.prompt_len
    mask = torch.ones(seq.shape[0], seq.shape[1] - p)
    pre = ctx.engine.score(seq, p, routes=True)
    dec = ctx.engine.score(seq, p, routes=True, cached_prefix=True)
    d = dec.logp - pre.logp
    st = D.abs_stats(d, mask, "x")
    o.figures["decode vs prefill abs_dlogp p99"] = st["x_p99"]
    o.figures["decode vs prefill abs_dlogp max"] = st["x_max"]
    if pre.routes is not None and dec.routes is not None:
        o.figures["decode vs prefill route_agreement"] = D.route_agreement(
            dec.routes, pre.routes, p, mask)["route_agreement"]
    t, _ = ctx.trainer.score(seq, p, pre.routes if ctx.plan.contract.routing_replay != "none" else None)
    drift = by_position(t - pre.logp, mask)["mean"]
    third = max(1, len(drift) // 3)
    early, late = sum(drift[:third]) / third, sum(drift[-third:]) / third
    o.figures["context length"] = int(seq.shape[1])
    o.figures["same_version abs_dlogp mean, first third of context"] = early
    o.figures["same_version abs_dlogp mean, last third of context"] = late
    o.data.update({"context_drift": drift, "decode_vs_prefill": by_position(d, mask)["mean"]})
    level4 = thresholds(ctx.expectations, 4) + thresholds(ctx.expectations, 6)
    budget = next((t["value"] for t in level4 if t.get("value") is not None and "abs_dlogp p99" in t["metric"]), 0.05)
    if not o.check("decode vs prefill abs_dlogp p99", "<=", budget, st["x_p99"],
                   "request state adds no more than the same-version budget"):
        worst = int(torch.tensor(by_position(d, mask)["mean"]).argmax())
        o.findings.append(f"decoding through the cache departs from one prefill (p99 {st['x_p99']:.3g}, "
                          f"worst at position {worst + p} of {seq.shape[1]}): request state")
