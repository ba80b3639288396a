"""What several targets read of a Plan is computed once and kept beside it (pcc.lower.once): the converter plan
`pcc convert CONTRACT` runs is the one its compile lowered, the skip list every rollout target asks for is one
list; another Plan has its own, and an error is raised again, not kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pcc.lower.converter as converter
from pcc.lower import compile_file, lower, once
from pcc.lower.checkpoint_config import skip_list

CONTRACT = str(Path(__file__).resolve().parents[2] / "contracts" / "unified_fp8.prec")


def test_the_converter_plan_is_the_one_the_compile_lowered(monkeypatch):
    compiled = compile_file(CONTRACT)
    assert compiled.ok
    plan = compiled.plan
    recomputed = []
    monkeypatch.setattr(converter, "tensor_targets", lambda *a: recomputed.append(a))  # what computing it calls
    doc = converter.converter_plan(plan)
    assert not recomputed and json.loads(lower(plan, "converter").files["convert/plan.json"]) == doc
    assert converter.converter_plan(plan) is doc and skip_list(plan) is skip_list(plan)
    monkeypatch.undo()
    other = compile_file(CONTRACT).plan
    assert converter.converter_plan(other) is not doc and converter.converter_plan(other) == doc


def test_an_error_is_raised_again_not_kept():
    plan = compile_file(CONTRACT).plan
    calls = []

    @once
    def refuses(p):
        calls.append(p)
        raise ValueError("cannot")

    for _ in range(2):
        with pytest.raises(ValueError, match="cannot"):
            refuses(plan)
    assert len(calls) == 2
