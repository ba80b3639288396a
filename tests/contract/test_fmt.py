"""The formatter: canonical, idempotent, comment-preserving, meaning-preserving."""

from pcc.lang.build import build
from pcc.lang.diagnostics import Reporter
from pcc.contract.fmt import format_source
from pcc.contract.model import Contract

MESSY = """# header
contract m {   model tiny_moe ; hardware cpu
  scheme w = int4 weights group 32   # trailing
  rollout sglang { linear : w keep bf16 : router,lm_head }
  trainer megatron { fprop, dgrad, wgrad : w qdq
    dgrad : bf16 }
  trainable lora rank 8 alpha 16 targets attn.q,attn.o
  sync adapter { schedule colocated }
  expect { version_age <= 0 }
}
"""


def _dict(text):
    rep = Reporter()
    d, _ = build(text, "m.prec", rep)
    assert not rep.diagnostics
    return Contract.model_validate(d)  # the meaning: what the scheme model makes of the statements


def test_fmt_is_canonical_and_idempotent():
    once = format_source(MESSY)
    assert format_source(once) == once
    assert "  rollout sglang {\n    linear : w\n    keep bf16 : router, lm_head\n  }" in once
    assert "    gemm : w qdq\n    dgrad : bf16\n" in once


def test_fmt_keeps_meaning_and_comments():
    once = format_source(MESSY)
    assert _dict(once) == _dict(MESSY)
    assert once.startswith("# header\n")
    assert "scheme w = int4 group 32  # trailing" in once
