"""`pcc diff` compares the engine arguments of every target the two bundles hold: Miles' and verl's
launches, vLLM's arguments, the FSDP trainer's fsdp.json, as the bundles carry them."""

import json
from pathlib import Path

from pcc.bundle.write import write_bundle
from pcc.cli import main
from pcc.diff import diff
from pcc.diff.engines import json_changes
from pcc.plan import compile_file

ROOT = Path(__file__).resolve().parents[2]


def _bundle(contract: Path, out: Path) -> dict[str, str]:
    """Compile `contract` into `out`; its files by path, as written."""
    write_bundle(compile_file(str(contract)).plan, out)
    return {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file()}


def test_miles_against_verl_shows_the_two_launches_and_nothing_else(tmp_path):
    """bf16_baseline on Miles and on verl: the same Megatron and SGLang arguments, so the only engine
    changes are Miles' files and flags going and verl's overrides coming, exactly as the bundles hold them."""
    a = _bundle(ROOT / "contracts/bf16_baseline.prec", tmp_path / "a")
    b = _bundle(ROOT / "contracts/verl/bf16_baseline.prec", tmp_path / "b")
    r = diff(str(tmp_path / "a"), str(tmp_path / "b"))
    e = r["engines"]
    assert list(e) == ["megatron", "sglang", "miles", "verl"]
    for same in ("megatron", "sglang"):
        assert (e[same]["lowered_by"], e[same]["args"], e[same]["env"], e[same]["files"]) == ("both", [], [], [])
    miles, verl = e["miles"], e["verl"]
    assert miles["lowered_by"] == "A only" and verl["lowered_by"] == "B only"
    assert [f["path"] for f in miles["files"]] == sorted(p for p in a if p.startswith("miles/"))
    assert {f["change"] for f in miles["files"]} == {"removed"}
    assert [f["path"] for f in verl["files"]] == sorted(p for p in b if p.startswith("verl/"))
    assert {f["change"] for f in verl["files"]} == {"added"}
    overrides = b["verl/overrides.txt"].splitlines()
    assert {c["field"]: c["to"] for c in verl["args"]} == dict(o.split("=", 1) for o in overrides)
    assert all(c["from"] is None for c in verl["args"])
    miles_flags = {w for w in a["miles/args.txt"].split() if w.startswith("--")}
    assert {c["field"] for c in miles["args"] if c["field"].startswith("--")} == miles_flags
    assert {"field": "script", "from": "train.py", "to": None} in miles["args"]
    assert all(c["to"] is None for c in miles["args"])
    assert [c["field"] for c in r["placement"]] == ["framework"]


def test_a_verl_rollout_rule_shows_the_override_it_changes(tmp_path):
    """One rollout rule more (an FP8 KV cache) on verl: vLLM's --kv-cache-dtype and the one verl override
    that carries it to vLLM, nothing in the trainer's arguments."""
    kv = tmp_path / "kv.prec"
    kv.write_text(f'contract unified-fp8-verl extends "{ROOT / "contracts/verl/unified_fp8.prec"}" {{\n'
                  "  rollout vllm {\n    kv_cache : fp8_e4m3\n  }\n}\n")
    r = diff(str(ROOT / "contracts/verl/unified_fp8.prec"), str(kv))
    e = r["engines"]
    assert list(e) == ["megatron", "vllm", "verl"]
    assert e["verl"]["args"] == [{"field": "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype",
                                  "from": None, "to": "'fp8_e4m3'"}]
    assert e["verl"]["env"] == [] and {f["path"] for f in e["verl"]["files"]} == {"verl/overrides.txt", "verl/launch.sh"}
    assert e["vllm"]["args"] == [{"field": "--kv-cache-dtype", "from": "auto", "to": "fp8_e4m3"}]
    assert e["megatron"]["args"] == e["megatron"]["env"] == e["megatron"]["files"] == []
    quant = next(f for f in e["vllm"]["files"] if f["path"] == "rollout/quantization_config.json")
    assert quant["fields"] == [{"field": "kv_cache_quant_algo", "from": None, "to": "FP8"}]


def test_the_fsdp_trainer_file_is_compared_field_by_field(capsys):
    """fp8_rowwise -> fp8_tensor on the FSDP trainer: trainer/fsdp.json's torchao recipe fields, and the
    trainer precision file consequence names the file."""
    a, b = ROOT / "contracts/fsdp/fp8_rowwise.prec", ROOT / "contracts/fsdp/fp8_tensor.prec"
    r = diff(str(a), str(b))
    (f,) = r["engines"]["fsdp"]["files"]
    assert f["path"] == "trainer/fsdp.json" and f["change"] == "changed"
    fields = {c["field"]: (c["from"], c["to"]) for c in f["fields"]}
    assert fields["low_precision[0].config.recipe"] == ("rowwise", None)
    assert fields["low_precision[0].config.casts.cast_config_weight.scaling_granularity"] == ("axiswise", "tensorwise")
    assert "trainer/fsdp.json" in r["consequences"]["trainer_precision_file"]["files"]
    assert main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "fsdp    file trainer/fsdp.json" in out and "low_precision[0].config.recipe" in out


def test_json_changes():
    a = {"x": 1, "l": [{"m": ["a", "b"]}], "s": [1, 2]}
    b = {"x": 1, "l": [{"m": ["a"]}, {"m": ["c"]}], "s": [2, 1], "new": True}
    assert json_changes(a, b) == [{"field": "l[0].m", "from": ["a", "b"], "to": ["a"]},
                                  {"field": "l[1].m", "from": None, "to": ["c"]},
                                  {"field": "new", "from": None, "to": True},
                                  {"field": "s", "from": [1, 2], "to": [2, 1]}]


def test_the_json_report_carries_long_lists_whole_and_the_text_shortens_them(capsys):
    """A module list (every linear of a model) is whole in --json and shortened in the table."""
    assert main(["diff", str(ROOT / "contracts/fsdp/unified_fp8.prec"), str(ROOT / "contracts/fsdp/tiny_cpu.prec"),
                 "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)["result"]
    lists = [c for f in doc["engines"]["fsdp"]["files"] for c in f.get("fields", [])
             if isinstance(c["from"], list) and len(c["from"]) > 4]
    assert lists, "expected a module list among the fsdp.json changes"
    assert main(["diff", str(ROOT / "contracts/fsdp/unified_fp8.prec"), str(ROOT / "contracts/fsdp/tiny_cpu.prec")]) == 1
    assert f"{len(lists[0]['from'])} items: " in capsys.readouterr().out
