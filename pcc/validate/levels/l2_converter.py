"""Level 2, quantizer and converter: `pcc convert` writes the rollout checkpoint from the
trainer's weights, `pcc verify-checkpoint --full` checks every tensor of it against pcc's
quantizer and the element format's error bound, and the live sync's tensors (the runtime's
`convert_full` of the same weights) must be the same bytes as the file once its static NVFP4
input scales are calibrated (the converter writes 1.0; the finding says so).
"""

from __future__ import annotations

import torch

from . import Outcome

LOOK = ["the first problem per tensor family above (pcc verify-checkpoint CONTRACT DIR --source SRC --full)",
        "scale grids: shape [ceil(N/R), ceil(K/C)] for block scales, dtype and E8M0 bytes for MX",
        "packing order (element 2i in the low nibble) and padding of partial edge blocks",
        "tensor names and the skip list (modules_to_not_convert / ignore) in config.json"]


def run(ctx) -> Outcome:
    from pcc.runtime.weights import convert_full

    o = Outcome(look=list(LOOK))
    ckpt = ctx.checkpoint()
    rep = ctx.verified
    o.figures.update({"checkpoint": str(ckpt), "layout": rep["layout"], "tensors": rep["tensors"],
                      "values_checked": rep["values_checked"], "problems": rep["problems"],
                      "codes equal pcc's quantizer": 1 if rep["ok"] else 0})
    for p in rep["problems"]:
        more = f" (+{p['count'] - 1} more)" if p["count"] > 1 else ""
        o.findings.append(f"checkpoint {p['family']}: {p['tensor']}: {p['message']}{more}")
    if not rep["ok"]:
        return o
    cal = ctx.calibration
    if cal:
        o.figures["static input_scale operators"] = cal["operators"]
        o.figures["input_scale left uncalibrated by pcc convert"] = len(cal["replaced"])
        if cal["replaced"]:
            first, value = next(iter(cal["replaced"].items()))
            o.findings.append(f"pcc convert wrote {len(cal['replaced'])} uncalibrated input_scale tensor(s) (first "
                              f"{first} = {value:g}); pcc validate replaced them with the calibration "
                              "(pcc.runtime.calibrate.input_scales) before serving, as the live sync computes them")
    live = convert_full(ctx.plan, ctx.runtime_trainer.weights(), ctx.plan.contract.sync.bridge)
    disk = ctx.checkpoint_tensors()
    differ = [n for n, t in live.items() if n not in disk or not _same_bytes(t, disk[n])]
    if differ:
        o.findings.append(f"the live sync converts {len(differ)} tensor(s) differently from pcc convert, "
                          f"first {differ[0]}: a runtime update would not install what the checkpoint holds")
    o.check("live-sync tensors differing from the checkpoint", "==", 0, len(differ),
            "a sync and an offline conversion of the same weights are the same bytes")
    return o


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))
