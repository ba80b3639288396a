"""Property: no input, random or mutated, escapes as an exception; every failure is positioned."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pcc.contract.model import Contract
from pcc.lang.build import build
from pcc.lang.diagnostics import DiagnosticError, Reporter
from pydantic import ValidationError

SEED = """contract fuzz {
  model tiny_moe
  hardware cpu
  scheme fp8_block = fp8_e4m3 weights block 128x128 activations tile 1x128 scale fp32
  rollout sglang {
    linear : fp8_block real
    experts.*[1..3], attn.q : fp8_block
    kv_cache : fp8_e4m3
    keep bf16 : embed, lm_head, router, norm, "model.visual.*"
    parallel tp 2 ep 2
    max_tokens 4096
    record logprobs, experts
  }
  trainer megatron {
    gemm : bf16
    fprop experts.* : fp8_block qdq accumulate fp32 output bf16
    params bf16 master fp32 moments fp32
    optimizer adam distributed
  }
  trainable lora rank 16 alpha 32 targets attn.q, attn.o
  sync adapter { schedule async max_staleness 2 bridge bf16 activation atomic }
  correction tis clip 2.0 low 0.5
  routing replay rollout
  expect {
    same_version abs_dlogp p99 <= 0.15
    version_age <= 2
  }
}
"""
TOKENS = ["{", "}", ":", ",", "[", "]", "..", "=", "+", "<=", '"', "#", "\n", "-1", "0", "128x128", "1e9",
          "contract", "model", "from", "scheme", "rollout", "trainer", "keep", "gemm", "fprop", "sync",
          "expect", "extends", "experts.*", "*", "linear", "fp8_e4m3", "nvfp4", "group", "tile", "\x00", "é"]


def _run(text: str) -> None:
    rep = Reporter()
    try:
        d, smap = build(text, "f.prec", rep)
    except DiagnosticError as exc:
        assert exc.diagnostics and all(d.span is not None and d.span.line >= 1 and d.span.col >= 1
                                       for d in exc.diagnostics)
        return
    for diag in rep.diagnostics:
        assert diag.span is not None
    if not rep.has_errors:
        try:
            Contract.model_validate(d)
        except ValidationError:
            pass  # the loader turns these into PCC105 at the statement's span (tested elsewhere)


@st.composite
def mutated(draw):
    text = SEED
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["delete", "insert", "replace", "truncate", "duplicate"]))
        if op == "delete":
            text = text[:pos] + text[pos + draw(st.integers(1, 20)):]
        elif op == "insert":
            text = text[:pos] + " " + draw(st.sampled_from(TOKENS)) + " " + text[pos:]
        elif op == "replace":
            text = text[:pos] + draw(st.text(max_size=5)) + text[pos + 5:]
        elif op == "truncate":
            text = text[:pos]
        else:
            end = min(len(text), pos + draw(st.integers(1, 80)))
            text = text[:end] + text[pos:end] + text[end:]
    return text


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutated())
def test_mutated_contracts_never_crash(text):
    _run(text)


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.text(max_size=300) | st.lists(st.sampled_from(TOKENS), max_size=60).map(" ".join))
def test_random_text_never_crashes(text):
    _run(text)


def test_deep_nesting_is_positioned():
    _run("contract a {" + "{" * 5000 + "}" * 5000 + "}")
    _run("contract a { expect { " + "[" * 10000 + " } }")


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutated())
def test_mutated_contracts_compile_without_crashing(tmp_path_factory, text):
    """The whole pipeline (load, resolve, checks) on mutated input: diagnostics, never a traceback."""
    from pcc.plan import compile_file

    path = tmp_path_factory.mktemp("fuzz") / "f.prec"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    compiled = compile_file(str(path))
    for diag in compiled.diagnostics:
        assert diag.code.startswith("PCC") and (diag.span is not None or diag.path or diag.file)
