"""No contract field is dropped silently: every field a contract sets is honoured by one of the
targets it names (declared in the target's `honours`) or that target reports it with a coded
warning on the field (PCC616, or PCC612 for what another target honours). Fields the plan itself
consumes (the model, hardware, schemes, engines, the name) are not the targets' to honour.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from pcc.lower import compile_file as check_file, get_target, lower, targets_for
from pcc.plan import compile_file

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = sorted((ROOT / "contracts").rglob("*.prec"))  # the shipped ones and every subfolder (fsdp, verl, vllm)
RESOLVED = {"name", "extends", "model", "hardware", "schemes", "rollout.engine", "trainer.engine"}
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_engine_flags import groups, problems  # noqa: E402  the flag file's check


def set_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """Dotted paths of every field whose value is not the default (a sub-model is entered)."""
    out = []
    for name, info in type(model).model_fields.items():
        value, path = getattr(model, name), prefix + name
        if isinstance(value, BaseModel):
            out += set_fields(value, path + ".")
        elif value != info.get_default(call_default_factory=True):
            out.append(path)
    return out


def unhonoured(plan) -> list[str]:
    names = targets_for(plan)
    honours = [h for n in names for h in get_target(n).honours]
    reported = {c.path for n in names for c in lower(plan, n).caveats if c.code in ("PCC612", "PCC616")}
    return [f for f in set_fields(plan.contract) if f not in reported
            and not any(f == h or f.startswith(h + ".") for h in (*RESOLVED, *honours))]


def _plan(tmp_path, body: str, name: str = "c"):
    path = tmp_path / f"{name}.prec"
    path.write_text(f"contract {name} {{\n  model qwen3_30b_a3b\n  hardware H100\n{body}}}\n", encoding="utf-8")
    c = compile_file(str(path))
    assert c.ok, [d.message for d in c.diagnostics if d.is_error]
    return c.plan


@pytest.mark.parametrize("path", CONTRACTS, ids=lambda p: str(p.relative_to(ROOT / "contracts")))
def test_every_field_a_shipped_contract_sets_is_honoured_or_reported(path):
    plan = compile_file(str(path)).plan
    assert not unhonoured(plan), f"{path.name}: fields no target honours or reports: {unhonoured(plan)}"


VARIANTS = {
    "max_tokens": "  rollout sglang {\n    max_tokens 8192\n  }\n  trainer megatron { }\n",
    "gpus_dp": "  rollout sglang {\n    parallel tp 2 dp 2 gpus 16\n  }\n  trainer megatron {\n    parallel tp 2 dp 4\n"
               "  }\n  sync full_weights { schedule async max_staleness 1 }\n",
    "colocated_gpus": "  rollout sglang {\n    parallel gpus 8\n  }\n  trainer megatron {\n    parallel tp 2 gpus 16\n  }\n",
    "record": "  rollout sglang {\n    record logprobs\n  }\n  trainer megatron { }\n",
    "uneven": "  rollout sglang { }\n  trainer megatron {\n    parallel tp 2 gpus 12\n  }\n",
    "dp_and_gpus": "  rollout sglang { }\n  trainer megatron {\n    parallel tp 2 dp 2 gpus 8\n  }\n",
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_fields_the_engine_bundle_used_to_drop_are_honoured_or_reported(tmp_path, name):
    plan = _plan(tmp_path, VARIANTS[name])
    assert not unhonoured(plan), unhonoured(plan)
    args = lower(plan, "miles").args[1:]
    assert not [p for f, v in groups(args) for p in problems(f, v)]  # Miles' parser takes them


def test_max_tokens_is_miles_max_response_length(tmp_path):
    a = lower(_plan(tmp_path, VARIANTS["max_tokens"]), "miles").args
    assert a[a.index("--rollout-max-response-len") + 1] == "8192"


def test_gpus_and_dp_place_the_trainer_and_rollout(tmp_path):
    m = lower(_plan(tmp_path, VARIANTS["gpus_dp"]), "miles")
    pairs = set(zip(m.args, m.args[1:]))
    # trainer: tp 2 x dp 4 = 8 GPUs, one H100 node; async rollout on its own 16
    assert {("--actor-num-nodes", "1"), ("--actor-num-gpus-per-node", "8"), ("--rollout-num-gpus", "16"),
            ("--sglang-dp-size", "2")} <= pairs
    assert [c.code for c in m.caveats] == ["PCC612"]  # rollout dp > 1 wants SGLang's DP attention in the job


def test_a_trainer_spanning_nodes_uses_the_hardware_node_size(tmp_path):
    m = lower(_plan(tmp_path, VARIANTS["colocated_gpus"]), "miles")
    pairs = set(zip(m.args, m.args[1:]))
    assert {("--actor-num-nodes", "2"), ("--actor-num-gpus-per-node", "8")} <= pairs
    assert [(c.code, c.path) for c in m.caveats] == [("PCC616", "rollout.parallel.gpus")]  # colocated: 16, not 8


@pytest.mark.parametrize("name, path", [("uneven", "trainer.parallel.gpus"), ("dp_and_gpus", "trainer.parallel.dp"),
                                        ("record", "rollout.record")])
def test_what_the_launch_cannot_carry_is_pcc616_on_the_field(tmp_path, name, path):
    plan = _plan(tmp_path, VARIANTS[name])
    caveats = [c for n in targets_for(plan) for c in lower(plan, n).caveats if c.code == "PCC616"]
    assert [c.path for c in caveats] == [path]


def test_max_tokens_without_a_framework_is_pcc616_on_the_field(tmp_path):
    """No framework sends this contract's rollout requests, and SGLang's launch carries no response cap."""
    plan = _plan(tmp_path, "  rollout sglang {\n    max_tokens 8192\n  }\n  trainer fsdp { }\n")
    assert plan.contract.runs_on is None and not unhonoured(plan)
    (w,) = [c for n in targets_for(plan) for c in lower(plan, n).caveats if c.code == "PCC616"]
    assert w.path == "rollout.max_tokens" and "8192" in w.hint
    (d,) = [d for d in check_file(str(tmp_path / "c.prec")).diagnostics if d.code == "PCC616"]  # `pcc check`
    assert d.severity == "warning" and d.span.line == 5


def test_vllm_launch_caps_max_tokens_without_a_framework(tmp_path):
    """vLLM takes the cap at launch (--override-generation-config max_new_tokens: get_max_tokens takes
    the min with each request's max_tokens), so the vllm target honours the field and nothing warns."""
    plan = _plan(tmp_path, "  rollout vllm {\n    max_tokens 8192\n  }\n  trainer megatron { }\n")
    assert plan.contract.runs_on is None and not unhonoured(plan)
    assert "rollout.max_tokens" in get_target("vllm").honours
    assert not [c for n in targets_for(plan) for c in lower(plan, n).caveats if c.path == "rollout.max_tokens"]
    assert not [d for d in check_file(str(tmp_path / "c.prec")).diagnostics if d.code == "PCC616"]  # `pcc check`
    a = lower(plan, "vllm").args
    assert a[a.index("--override-generation-config") + 1] == '{"max_new_tokens": 8192}'


def test_max_tokens_under_a_framework_is_its_launch(tmp_path):
    plan = _plan(tmp_path, "  framework verl\n  rollout vllm {\n    max_tokens 8192\n  }\n  trainer fsdp { }\n")
    assert not [c for n in targets_for(plan) for c in lower(plan, n).caveats if c.path == "rollout.max_tokens"]
    assert "rollout.max_tokens" in get_target("verl").honours and not unhonoured(plan)
    assert "--override-generation-config" not in lower(plan, "vllm").args  # verl's response_length, per request


def test_a_field_nobody_honours_is_found(tmp_path, monkeypatch):
    """The check itself: with max_tokens taken out of the Miles target's honours, it is reported."""
    plan = _plan(tmp_path, VARIANTS["max_tokens"])
    t = get_target("miles")
    from pcc.lower import _TARGETS

    monkeypatch.setitem(_TARGETS, "miles", type(t)(t.name, tuple(h for h in t.honours if h != "rollout.max_tokens"), t.fn))
    assert unhonoured(plan) == ["rollout.max_tokens"]
