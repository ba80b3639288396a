"""The promise, fuzzed through lowering: a contract that checks compiles, and its YAML twin
compiles to the same bundle.

Each case mutates a shipped contract (one extra rollout or trainer rule, a keep rule,
another hardware, parallel sizes, sync or trainable changes, another framework and rollout engine), writes it as .prec and as
YAML, and runs both through `pcc.lower.compile_file` (what `pcc check` and `pcc compile`
run) and `bundle_files`. Any exception is a failure; so is a contract whose .prec and
YAML twins disagree, or one that checks but does not write a bundle. The model is
swapped for a CPU-size catalog of the same kind so that 2,000 cases run in about a
minute; `bench/fuzz.py --real` runs the same mutations on the real catalogs.
"""

from __future__ import annotations

import json
import random
import traceback
from pathlib import Path

import pytest
import yaml

from pcc.bundle.write import bundle_files
from pcc.contract.fmt import lines
from pcc.contract.io import load
from pcc.lower import compile_file

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = sorted((ROOT / "contracts").glob("*.prec"))
HARDWARE = ["H100", "H200", "B200", "GB200", "MI300X", "MI355X", "cpu", "A100"]
PATTERNS = ["linear", "attn", "attn.q", "attn.kv", "attn.o", "mlp", "experts.*", "experts.gate_up",
            "experts.down", "shared_experts.*", "router", "kv_cache", "lm_head", "embed", "norm", "attn[0]",
            "mlp[1..2]", "experts.*[0]", "name:*.q_proj.weight", "all"]
SCHEMES = ["bf16", "fp8_block", "fp8_tensor", "fp8_row", "fp8_delayed", "mxfp8", "mxfp4", "nvfp4", "int4_g32",
           "int4_g128", "int8", "w8a8_int8", "fp8_e5m2", "fp16"]
OPTS = [{}, {}, {"gemm": "real"}, {"gemm": "qdq"}, {"accumulate": "bf16"}, {"accumulate": "fp32"},
        {"output": "fp32"}, {"output": "bf16"}]
COMPONENTS = [["fprop"], ["dgrad"], ["wgrad"], ["fprop", "dgrad", "wgrad"], ["fprop", "dgrad"], ["dgrad", "wgrad"]]
STAND_IN = {True: ["tiny_moe", "tiny_shared_moe", "tiny_moe_128"], False: ["tiny_dense"]}


def _base(path: Path) -> dict:
    c = load(str(path)).contract
    d = c.model_dump(mode="json", exclude_defaults=True)
    d["name"] = c.name
    d.pop("extends", None)
    return d


def _rule(rng: random.Random, section: str) -> dict:
    r = {"patterns": rng.sample(PATTERNS, rng.choice([1, 1, 2])), "scheme": rng.choice(SCHEMES), **rng.choice(OPTS)}
    r["components"] = ["rollout"] if section == "rollout" else rng.choice(COMPONENTS)
    if rng.random() < 0.15:  # a keep rule covers its whole section
        r.update(keep=True, scheme="bf16", components=["rollout"] if section == "rollout" else COMPONENTS[3])
        for k in ("gemm", "accumulate", "output"):
            r.pop(k, None)
    return r


def mutate(base: dict, rng: random.Random, moe: bool) -> dict:
    d = json.loads(json.dumps(base))
    d["model"] = {"catalog": rng.choice(STAND_IN[moe])}
    for _ in range(rng.choice([1, 1, 2, 3])):
        kind = rng.random()
        if kind < 0.35:
            d.setdefault("rollout", {}).setdefault("rules", []).append(_rule(rng, "rollout"))
        elif kind < 0.7:
            d.setdefault("trainer", {}).setdefault("rules", []).append(_rule(rng, "trainer"))
        elif kind < 0.8:
            section = rng.choice([None, "rollout", "trainer"])
            (d.setdefault(section, {}) if section else d)["hardware"] = rng.choice(HARDWARE)
        elif kind < 0.9:
            section = rng.choice(["rollout", "trainer"])
            d.setdefault(section, {})["parallel"] = {k: rng.choice([1, 1, 2, 4]) for k in ("tp", "ep", "pp")}
        else:
            d["sync"] = {**d.get("sync", {}), "schedule": rng.choice(["colocated", "async"]),
                         "max_staleness": rng.choice([0, 1, 2]), "interval": rng.choice([1, 4])}
    if rng.random() < 0.1:  # another framework: its refusals (PCC625-PCC630) are diagnostics, never exceptions
        d["framework"] = rng.choice(["miles", "verl"])
        d.setdefault("rollout", {})["engine"] = rng.choice(["sglang", "vllm"])
    return d


def _prec(d: dict) -> str:
    return "\n".join(text for _, text in lines(d)) + "\n"


def _compile(path: Path):
    c = compile_file(str(path))
    files = bundle_files(c.plan)[0] if c.ok else None
    return c, files


def run_case(base: dict, seed: int, moe: bool, folder: Path) -> str | None:
    """None when the case keeps the promise, else what broke."""
    rng = random.Random(seed)
    d = mutate(base, rng, moe)
    prec, yml = folder / f"c{seed}.prec", folder / f"c{seed}.yaml"
    try:
        prec.write_text(_prec(d), encoding="utf-8")
        yml.write_text(yaml.safe_dump(d, sort_keys=False), encoding="utf-8")
        a, files_a = _compile(prec)
        b, files_b = _compile(yml)
    except Exception:  # noqa: BLE001 - the promise: no input escapes as an exception
        return f"seed {seed}: traceback\n{prec.read_text() if prec.exists() else d}\n{traceback.format_exc()}"
    codes_a = sorted(x.code for x in a.diagnostics)
    codes_b = sorted(x.code for x in b.diagnostics)
    if codes_a != codes_b or a.ok != b.ok:
        return f"seed {seed}: .prec {codes_a} vs YAML {codes_b}\n{prec.read_text()}"
    if files_a != files_b:
        diff = sorted(k for k in set(files_a) | set(files_b) if files_a.get(k) != files_b.get(k))
        return f"seed {seed}: twins compile to different bundles ({diff})\n{prec.read_text()}"
    return None


def _cases(n: int) -> list[tuple[Path, int]]:
    return [(CONTRACTS[k % len(CONTRACTS)], 1000 + k) for k in range(n)]


@pytest.mark.slow
def test_mutated_contracts_that_check_compile_and_twins_agree(tmp_path: Path) -> None:
    bases = {p: _base(p) for p in CONTRACTS}
    moe = {p: load(str(p)).contract.routing_replay != "none" or "experts" in json.dumps(bases[p]) for p in CONTRACTS}
    broken, checked = [], 0
    for path, seed in _cases(2000):
        problem = run_case(bases[path], seed, moe[path], tmp_path)
        checked += 1
        if problem:
            broken.append(f"{path.name}: {problem}")
            if len(broken) >= 3:
                break
    assert not broken, "\n\n".join(broken)
    assert checked == 2000


def test_shipped_contracts_and_their_twins_compile_identically(tmp_path: Path) -> None:
    """Every shipped contract's YAML and JSON twins compile to the same bundle files as the .prec."""
    from pcc.contract.io import export

    for path in CONTRACTS:
        c = load(str(path)).contract
        ref = _compile(path)[1]
        assert ref is not None, path.name
        for fmt in ("yaml", "json"):
            twin = tmp_path / f"{path.stem}.{fmt}"
            text = export(c, fmt)
            if c.model and c.model.path:
                raise AssertionError("shipped contracts name catalogs")
            twin.write_text(text, encoding="utf-8")
            assert _compile(twin)[1] == ref, f"{path.name}: the {fmt} twin compiles to another bundle"
