"""The validation ladder per contract: thresholds stated or derived from the configuration."""

from pathlib import Path

import yaml

from pcc.lower import lower
from pcc.plan import compile_file

ROOT = Path(__file__).resolve().parents[2]


def _ladder(tmp_path, text):
    p = tmp_path / "c.prec"
    p.write_text(text)
    c = compile_file(str(p))
    assert c.ok, [d.render() for d in c.diagnostics]
    return yaml.safe_load(lower(c.plan, "expectations").files["validate/expectations.yaml"])


def _thresholds(doc, level):
    return {t["metric"]: t for t in doc["levels"][level - 1]["thresholds"]}


def test_nine_levels_in_table6_order():
    doc = yaml.safe_load(lower(compile_file(str(ROOT / "contracts/glm52_fp8_rollout.prec")).plan,
                               "expectations").files["validate/expectations.yaml"])
    assert [lv["level"] for lv in doc["levels"]] == list(range(1, 10))
    assert doc["regime"] == "mismatched"
    assert _thresholds(doc, 4)["same_version abs_dlogp p99"]["source"] == "contract"
    assert _thresholds(doc, 8)["version_age"]["value"] == 2


BASE = """contract c {{
  model tiny_moe
  hardware cpu
  rollout {{
    experts : fp8_block
  }}
  trainer megatron {{
{trainer}
  }}
{extra}
  routing replay rollout
}}
"""


def test_matched_fprop_gets_the_tight_bound(tmp_path):
    doc = _ladder(tmp_path, BASE.format(trainer="    fprop experts : fp8_block qdq", extra=""))
    assert doc["regime"] == "matched"
    assert _thresholds(doc, 4)["same_version abs_dlogp p99"]["value"] == 0.05


def test_mismatched_fprop_gets_a_loose_derived_bound(tmp_path):
    doc = _ladder(tmp_path, BASE.format(trainer="    gemm : bf16", extra=""))
    assert doc["regime"] == "mismatched"
    t = _thresholds(doc, 4)["same_version abs_dlogp p99"]
    assert t["source"] == "derived" and t["value"] > 0.05
    assert _thresholds(doc, 5)["route_agreement"]["value"] == 1.0  # R3: trainer replays rollout routes


def test_frozen_different_bases_record_a_baseline(tmp_path):
    extra = "  trainable lora rank 4 alpha 8 targets attn\n  sync adapter"
    doc = _ladder(tmp_path, BASE.format(trainer="    gemm : bf16", extra=extra))
    assert doc["regime"] == "baseline"
    assert _thresholds(doc, 4)["step-0 baseline"]["op"] == "record"
    assert _thresholds(doc, 6)["baseline_drift abs_dlogp p99"]["value"] == 0.02


def test_async_version_age_follows_the_staleness_rule(tmp_path):
    extra = "  sync full_weights { schedule async max_staleness 3 }"
    doc = _ladder(tmp_path, BASE.format(trainer="    gemm : bf16", extra=extra))
    assert _thresholds(doc, 8)["version_age"]["value"] == 3
