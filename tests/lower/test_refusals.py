"""A target collects every refusal before it reports (sqlglot's ErrorLevel.RAISE): `pcc check` shows each
one on its rule, not only the first of each target."""

from __future__ import annotations

import json

import pytest

from pcc.cli import main
from pcc.lower import Refused, get_target, lower
from pcc.plan import compile_file

FOUR = """contract four-refusals {
  model tiny_dense
  hardware H100
  rollout sglang {
    linear : fp8_tensor
    attn.o : fp8_tensor accumulate bf16
    attn.q : fp8_tensor output fp32
  }
  trainer megatron {
    gemm linear : fp8_tensor
    fprop attn.o : fp8_tensor accumulate bf16
    fprop attn.q : fp8_tensor output fp32
  }
  sync full_weights { interval 4 }
}
"""


def test_check_reports_all_four_refusals_each_on_its_rule(tmp_path, capsys):
    path = tmp_path / "four.prec"
    path.write_text(FOUR)
    assert main(["check", str(path), "--json"]) == 1
    got = {(d["code"], d["line"]) for d in json.loads(capsys.readouterr().out)["diagnostics"]}
    assert got == {("PCC601", 6), ("PCC602", 7), ("PCC601", 11), ("PCC602", 12)}


def test_a_target_raises_every_refusal_together_and_miles_repeats_none(tmp_path):
    path = tmp_path / "four.prec"
    path.write_text(FOUR)
    plan = compile_file(str(path)).plan
    with pytest.raises(Refused) as megatron:
        lower(plan, "megatron")
    assert [e.code for e in megatron.value.found] == ["PCC601", "PCC602"]
    with pytest.raises(Refused) as miles:  # composes megatron's and sglang's records: their refusals, once each
        lower(plan, "miles")
    assert sorted(e.code for e in miles.value.found) == ["PCC601", "PCC601", "PCC602", "PCC602"]


def test_outside_lower_a_refusal_raises_at_once(tmp_path):
    """A target function called directly (no collector) stops at its first refusal."""
    from pcc.lower import Unsupported

    path = tmp_path / "four.prec"
    path.write_text(FOUR)
    plan = compile_file(str(path)).plan
    with pytest.raises(Unsupported) as first:
        get_target("sglang").fn(plan)
    assert first.value.code == "PCC601" and not isinstance(first.value, Refused)


def test_verl_reports_its_trainers_and_its_rollouts_refusals_together(tmp_path, capsys):
    """verl composes the Megatron records and lowers its vLLM rollout: both targets' refusals at once."""
    path = tmp_path / "four.prec"
    path.write_text(FOUR.replace("  hardware H100\n", "  hardware H100\n  framework verl\n")
                    .replace("rollout sglang", "rollout vllm"))
    plan = compile_file(str(path)).plan
    with pytest.raises(Refused) as verl:
        lower(plan, "verl")
    assert sorted(e.code for e in verl.value.found) == ["PCC601", "PCC601", "PCC602", "PCC602"]
    assert main(["check", str(path), "--json"]) == 1
    got = {(d["code"], d["line"]) for d in json.loads(capsys.readouterr().out)["diagnostics"] if d["code"] != "PCC626"}
    assert got == {("PCC601", 7), ("PCC602", 8), ("PCC601", 12), ("PCC602", 13)}
