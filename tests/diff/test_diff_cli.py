"""`pcc diff` as a user and CI meet it: exit codes, formats, bundles, errors, engine arguments."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import pcc.lower
from pcc.cli import main
from pcc.diff import diff_plans
from pcc.diff.engines import settings_view
from pcc.lower import Lowered
from pcc.lower.settings import Setting, env, flag
from pcc.plan import compile_file

PAIRS = Path(__file__).resolve().parent / "pairs"
A, REORDERED, KV = (str(PAIRS / n) for n in ("tiny_a.prec", "tiny_reordered.yaml", "tiny_attn_kv.prec"))


def test_exit_codes_and_text(capsys):
    assert main(["diff", A, REORDERED]) == 0
    assert "no semantic change" in capsys.readouterr().out
    assert main(["diff", A, KV]) == 1
    out = capsys.readouterr().out
    assert "attn.kv" in out and "validation levels to re-run" in out


def test_json_and_markdown(capsys):
    assert main(["diff", A, KV, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)["result"]
    assert report["changed"] and report["components"]["rollout"][0]["family"] == "attn.kv"
    assert main(["diff", A, KV, "--format", "markdown"]) == 1
    md = capsys.readouterr().out
    assert md.startswith("### pcc diff:")
    assert "| family | change | A | B | tensors | layers | example |" in md
    assert "- [ ] 4. fixed-prefix scoring" in md and "<details><summary>decided by</summary>" in md


def test_contract_with_errors_exits_2_with_its_diagnostics(tmp_path, capsys):
    bad = tmp_path / "bad.prec"
    bad.write_text(Path(A).read_text().replace("experts.* : fp8_block", "experts.* : fp8_rwo"))
    assert main(["diff", A, str(bad)]) == 2
    err = capsys.readouterr().err
    assert "PCC202" in err and "fp8_rwo" in err
    assert main(["diff", A, str(tmp_path / "missing.prec")]) == 2
    assert "no such contract file" in capsys.readouterr().err
    assert main(["diff", A, A, "--model", "no_such_model"]) == 2


def test_model_override_resolves_both_sides_on_one_catalog(capsys):
    assert main(["diff", A, KV, "--model", "tiny_moe", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["result"]["b"]["name"] == "tiny_moe"


def test_bundle_directory(tmp_path, capsys):
    import hashlib

    from pcc.bundle import MANIFEST
    from pcc.bundle.write import write_bundle

    bundle = tmp_path / "bundle"
    write_bundle(compile_file(A).plan, bundle, targets=("sglang",))
    assert main(["diff", str(bundle), A]) == 0
    assert "note:" not in capsys.readouterr().out
    # plan.json from another pcc (its lock differs), the manifest consistent with it: a stale bundle
    (bundle / "plan.json").write_text(json.dumps({"lock": "sha256:0"}))
    manifest = json.loads((bundle / MANIFEST).read_text())
    manifest["files"]["plan.json"] = hashlib.sha256((bundle / "plan.json").read_bytes()).hexdigest()
    (bundle / MANIFEST).write_text(json.dumps(manifest))
    assert main(["diff", str(bundle), KV]) == 1
    assert "the bundle is stale" in capsys.readouterr().out
    # an edited contract.prec is refused, never diffed as if it were what was compiled
    (bundle / "contract.prec").write_text(Path(KV).read_text())
    assert main(["diff", str(bundle), KV, "--json"]) == 2
    env = json.loads(capsys.readouterr().out)
    assert env["diagnostics"][-1]["code"] == "PCC706" and "contract.prec" in env["diagnostics"][-1]["message"]
    assert main(["diff", str(tmp_path), A]) == 2  # a folder without contract.prec
    shutil.copy(A, tmp_path / "contract.prec")
    assert main(["diff", str(tmp_path), A]) == 2  # nor is a folder with contract.prec and no manifest a bundle
    assert "no manifest.json" in capsys.readouterr().err


@pytest.fixture
def fake_target():
    """A tiny engine target: one flag per rollout scheme in use, plus an env and a file."""
    name = "diff_test_engine"

    def lower_fake(plan) -> Lowered:
        used = sorted({plan.scheme_name("rollout", i) for i in range(len(plan.catalog.operators))})
        tp = str(plan.contract.rollout.parallel.tp)
        return Lowered(name, settings=[flag(name, "--quantization", ",".join(used), "rollout.rules"),
                                       flag(name, "--tp-size", tp, "rollout.parallel.tp"),
                                       env(name, "FAKE_SCHEMES", str(len(used)), "rollout.rules")],
                       files={"precision.yaml": "\n".join(used)})

    pcc.lower.target(name)(lower_fake)
    yield name
    pcc.lower._TARGETS.pop(name)


def test_engine_arguments_through_a_registered_target(fake_target):
    pa, pb = compile_file(A).plan, compile_file(KV).plan
    r = diff_plans(pa, pb, targets=(fake_target, "no_such_target"))
    e = r["engines"][fake_target]
    assert e["available"] and e["args"] == []  # same schemes in use on both sides, same tp
    assert r["engines"]["no_such_target"]["available"] is False
    assert "no_such_target" in r["engines"]["no_such_target"]["note"]
    pc = compile_file(str(PAIRS / "tiny_reordered.yaml")).plan  # no semantic change: nothing is lowered
    assert diff_plans(pa, pc, targets=(fake_target,))["engines"] == {}


def test_engine_argument_changes(fake_target, tmp_path):
    b = tmp_path / "b.prec"
    b.write_text(Path(A).read_text().replace("fp8_block", "fp8_tensor")
                 .replace("norm\n  }", "norm\n    parallel tp 2\n  }", 1))
    r = diff_plans(compile_file(A).plan, compile_file(str(b)).plan, targets=(fake_target,))
    e = r["engines"][fake_target]
    assert {c["field"]: (c["from"], c["to"]) for c in e["args"]} == {
        "--quantization": ("bf16,fp8_block", "bf16,fp8_tensor"), "--tp-size": ("1", "2")}
    assert e["env"] == [] and e["files"] == [{"path": "precision.yaml", "change": "changed"}]


def test_settings_as_the_diff_shows_them():
    """Records, not argv: a bare flag shows "", several words joined, a repeated key both values, a Hydra
    key as Hydra reads it, and variables apart."""
    records = [flag("e", "--bf16"), flag("e", "--fp8-format", "e4m3"),
               flag("e", "--lora-target-modules", ("q_proj", "o_proj")), flag("e", "--x", "1"), flag("e", "--x", "2"),
               Setting("e", "key", "a.b", 0.5, None), Setting("e", "key", "a.c", "0.5_2.0", None),
               Setting("e", "key", "a.d", ["q", "v"], None), env("e", "NVTE_X", "1")]
    assert settings_view(records) == ({"--bf16": "", "--fp8-format": "e4m3", "--lora-target-modules": "q_proj o_proj",
                                       "--x": "1 | 2", "a.b": "0.5", "a.c": "'0.5_2.0'", "a.d": "['q','v']"},
                                      {"NVTE_X": "1"})
