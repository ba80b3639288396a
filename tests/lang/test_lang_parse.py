"""The parser and builder: spans, canonical dicts, and positioned errors."""

import pytest

from pcc.contract.io import load
from pcc.contract.model import Contract
from pcc.lang.build import build, parse_scheme
from pcc.lang.diagnostics import DiagnosticError, Reporter

SMALL = """contract small {
  model tiny_moe
  hardware cpu
  scheme fp8_block = fp8_e4m3 weights block 128x128 activations tile 1x128
  rollout sglang {
    linear : fp8_block
    keep bf16 : router, lm_head
  }
  trainer megatron {
    fprop : fp8_block qdq
    dgrad, wgrad : bf16
  }
}
"""


def _errors(text: str, file: str = "x.prec"):
    with pytest.raises(DiagnosticError) as exc:
        rep = Reporter()
        build(text, file, rep)
        rep.fail_if_errors()
    return exc.value.diagnostics


def test_builds_canonical_dict_with_spans():
    rep = Reporter()
    d, smap = build(SMALL, "s.prec", rep)
    assert not rep.diagnostics
    assert d["rollout"]["rules"][1] == {"components": ["rollout"], "keep": True, "scheme": "bf16",
                                        "patterns": ["router", "lm_head"]}
    # "fprop : X" means all linear operators; "dgrad, wgrad" names two components.
    assert d["trainer"]["rules"][0]["patterns"] == ["linear"]
    assert d["trainer"]["rules"][0]["gemm"] == "qdq"
    assert d["trainer"]["rules"][1]["components"] == ["dgrad", "wgrad"]
    assert (smap["rollout.rules[1]"].line, smap["rollout.rules[1]"].col) == (7, 5)
    assert (smap["trainer.rules[1]"].line, smap["trainer.rules[1]"].col) == (11, 5)
    assert Contract.model_validate(d).rollout.rules[0].scheme == "fp8_block"


def test_scheme_expressions_state_what_was_written():
    # Defaults are the scheme model's (pcc.contract.scheme), the same for YAML and JSON.
    assert parse_scheme("mxfp8") == {"format": "mxfp8"}
    assert parse_scheme("int4 group 32") == {"format": "int4", "grouping": {"kind": "group", "size": 32}}
    assert parse_scheme("nvfp4 scale e4m3+fp32") == {"format": "nvfp4", "scale": "e4m3_fp32"}


def test_unknown_format_points_at_the_format(tmp_path):
    from pcc.contract.io import load

    f = tmp_path / "x.prec"
    f.write_text("contract a {\n  scheme s = fp9\n}\n")
    with pytest.raises(DiagnosticError) as exc:
        load(str(f))
    (d,) = exc.value.diagnostics
    assert (d.code, d.span.line, d.span.col) == ("PCC105", 2, 14)
    assert "fp8_e4m3" in d.message  # the formats the model accepts


@pytest.mark.parametrize("text, code, line, col", [
    ("contract a {\n  modle tiny_moe\n}\n", "PCC101", 2, 3),
    ("contract a {\n  model tiny_moe\n", "PCC103", 2, 17),
    ("contract a {\n  model tiny_moe $\n}\n", "PCC102", 2, 18),
    ("contract a {\n  model tiny_moe\n  model tiny_dense\n}\n", "PCC106", 3, 3),
    ("contract a {\n  scheme s = int4 group 32\n  scheme s = int4 group 64\n}\n", "PCC106", 3, 3),
])
def test_errors_are_positioned(text, code, line, col):
    (d,) = _errors(text)
    assert (d.code, d.span.line, d.span.col) == (code, line, col)
    rendered = d.render({"x.prec": text})
    assert f"x.prec:{line}:{col}: error[{code}]" in rendered and "^" in rendered


def test_unknown_keyword_gets_did_you_mean():
    (d,) = _errors("contract a {\n  hardwre H100\n}\n")
    assert d.code == "PCC101" and "did you mean 'hardware'" in d.hint


def test_validation_errors_point_at_the_statement(tmp_path):
    p = tmp_path / "c.prec"
    p.write_text("contract c {\n  model tiny_moe\n  hardware cpu\n  trainable lora rank 0 alpha 8 targets attn.q\n}\n")
    with pytest.raises(DiagnosticError) as exc:
        load(str(p))
    (d,) = exc.value.diagnostics
    assert d.code == "PCC105" and (d.span.line, d.span.col) == (4, 18)


@pytest.mark.parametrize("payload", [b"\x00\x01\xff" * 100, "contract a {".encode() * 3000,
                                     b"contract a {\n" + b"\xe9\n}"])
def test_malformed_files_are_diagnosed(tmp_path, payload):
    p = tmp_path / "bad.prec"
    p.write_bytes(payload)
    with pytest.raises(DiagnosticError) as exc:
        load(str(p))
    assert all(d.code.startswith("PCC1") for d in exc.value.diagnostics)


def test_huge_file_is_refused_early(tmp_path):
    p = tmp_path / "big.prec"
    p.write_bytes(b"contract a {\n" + b"# pad\n" * (2 << 20))
    with pytest.raises(DiagnosticError) as exc:
        load(str(p))
    assert exc.value.diagnostics[0].code == "PCC104"


def test_cyclic_extends(tmp_path):
    (tmp_path / "a.prec").write_text('contract a extends "b.prec" {\n  hardware cpu\n}\n')
    (tmp_path / "b.prec").write_text('contract b extends "a.prec" {\n  model tiny_moe\n}\n')
    with pytest.raises(DiagnosticError) as exc:
        load(str(tmp_path / "a.prec"))
    (d,) = exc.value.diagnostics
    assert d.code == "PCC107" and "cyclic" in d.message and d.span.line == 1


def test_extends_appends_rules_and_overrides_sections(tmp_path):
    (tmp_path / "base.prec").write_text(SMALL)
    (tmp_path / "child.prec").write_text(
        'contract child extends "base.prec" {\n  rollout {\n    experts.* : bf16\n  }\n'
        '  sync full_weights { interval 4 }\n}\n')
    loaded = load(str(tmp_path / "child.prec"))
    c = loaded.contract
    assert c.name == "child" and c.model.catalog == "tiny_moe"
    assert [r.patterns for r in c.rollout.rules] == [["linear"], ["router", "lm_head"], ["experts.*"]]
    assert c.sync.interval == 4 and c.trainer.rules[0].gemm == "qdq"
    # The child's rule keeps its own span, at its shifted index.
    span = loaded.smap["rollout.rules[2]"]
    assert span.file.endswith("child.prec") and span.line == 3


def test_yaml_and_json_errors_are_positioned(tmp_path):
    from pcc.plan import compile_file

    j = tmp_path / "c.json"
    j.write_text('{\n  "name": "j",\n  "model": {"catalog": "tiny_moe"},\n  "hardware": "cpu",\n'
                 '  "trainable": {"kind": "lora", "rank": 0, "alpha": 8, "targets": ["attn.q"]}\n}\n')
    (d,) = compile_file(str(j)).diagnostics
    assert (d.code, d.span.line, d.span.col) == ("PCC105", 5, 33)
    y = tmp_path / "c.yaml"
    y.write_text("name: y\nmodel: {catalog: tiny_moe}\nhardware: cpu\nrollout:\n  rules:\n"
                 "    - components: [rollout]\n      patterns: [expert.*]\n      scheme: fp8_block\n")
    (d,) = compile_file(str(y)).diagnostics
    assert (d.code, d.span.line, d.span.col) == ("PCC201", 7, 18) and "experts.*" in d.hint


def test_scale_rule_parses_and_is_checked(tmp_path):
    from pcc.plan import compile_file

    assert parse_scheme("mxfp8 scale_rule ceil")["scale_rule"] == "ceil"
    p = tmp_path / "c.prec"
    p.write_text("contract c {\n  model tiny_moe\n  hardware cpu\n  scheme s = fp8_e4m3 scale_rule ceil\n"
                 "  rollout {\n    experts : s\n  }\n  routing replay rollout\n}\n")
    errors = [d for d in compile_file(str(p)).diagnostics if d.is_error]
    assert [(d.code, d.span.line) for d in errors] == [("PCC302", 4)]


def test_a_contract_name_with_a_dot_says_what_names_hold():
    (d,) = _errors("contract qwen3.5-test {\n  model tiny_dense\n}\n")
    assert (d.code, d.span.line, d.span.col) == ("PCC101", 1, 15)
    assert "letters, digits, '_' and '-'" in d.hint and "'qwen3_5-test'" in d.hint


def test_framework_statement_in_prec_yaml_and_fmt(tmp_path):
    """`framework verl` is positioned, merges through extends, means the same in YAML, and formats back; a
    misspelled name is PCC105 at the statement with a did-you-mean, in .prec and YAML alike."""
    from pcc.contract.fmt import format_source

    rep = Reporter()
    d, smap = build("contract c {\n  model tiny_moe\n  framework verl\n}\n", "c.prec", rep)
    assert d["framework"] == "verl" and (smap["framework"].line, smap["framework"].col) == (3, 3)
    assert format_source('contract c {\n  model tiny_moe\n    framework   verl  # launcher\n}\n') == \
        "contract c {\n  model tiny_moe\n  framework verl  # launcher\n}\n"
    (tmp_path / "base.prec").write_text(SMALL)
    (tmp_path / "child.prec").write_text('contract child extends "base.prec" {\n  framework verl\n}\n')
    child = load(str(tmp_path / "child.prec")).contract
    assert child.framework == "verl" and child.runs_on == "verl"
    base = load(str(tmp_path / "base.prec")).contract
    assert base.framework is None and base.runs_on == "miles"  # Megatron + SGLang: Miles, as before
    assert base.model_copy(update={"rollout": base.rollout.model_copy(update={"engine": "vllm"})}).runs_on is None
    (tmp_path / "y.yaml").write_text("name: y\nmodel: {catalog: tiny_moe}\nframework: verl\n")
    assert load(str(tmp_path / "y.yaml")).contract.framework == "verl"
    for name, text in (("bad.prec", "contract c {\n  model tiny_moe\n  framework verll\n}\n"),
                       ("bad.yaml", "name: c\nmodel: {catalog: tiny_moe}\nframework: verll\n")):
        (tmp_path / name).write_text(text)
        with pytest.raises(DiagnosticError) as exc:
            load(str(tmp_path / name))
        (diag,) = exc.value.diagnostics
        assert (diag.code, diag.span.line, diag.hint) == ("PCC105", 3, "did you mean 'verl'?"), name
