"""Each targets/*.yaml table against its JSON Schema (schemas/targets/NAME.schema.json): a typo'd key
or a value of the wrong kind in a hand-edited table fails here, not as a KeyError in a lowering."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from pcc.resources import data_dir, target_table

TABLES = sorted(p.stem for p in data_dir("targets").glob("*.yaml"))


def _schema(name: str) -> dict:
    return json.loads((data_dir("schemas") / "targets" / f"{name}.schema.json").read_text(encoding="utf-8"))


def _errors(name: str, table) -> list[str]:
    validator = jsonschema.Draft202012Validator(_schema(name))
    return [f"{'.'.join(map(str, e.absolute_path)) or '<top>'}: {e.message}" for e in validator.iter_errors(table)]


def test_every_table_has_a_schema():
    schemas = sorted(p.name.removesuffix(".schema.json") for p in (data_dir("schemas") / "targets").glob("*.json"))
    assert len(TABLES) >= 8 and schemas == TABLES


@pytest.mark.parametrize("name", TABLES)
def test_table_matches_its_schema(name):
    jsonschema.Draft202012Validator.check_schema(_schema(name))
    assert _errors(name, target_table(name)) == []


def _typo(t):  # a misspelled key in a hardware entry
    t["hardware"]["H100"]["memory_gb"] = t["hardware"]["H100"].pop("memory_gib")


def _top_level_typo(t):
    t["lora_modul"] = t.pop("lora_modules")


def _wrong_kind(t):
    t["target"]["sglang"]["versioning"] = "semver"


def _nested_typo(t):
    t["megatron_args"]["--fp8-format"] = {"transformr": "fp8"}


@pytest.mark.parametrize("name, break_it, where", [
    ("hardware", _typo, "hardware.H100"),
    ("sglang", _top_level_typo, "<top>"),
    ("engines", _wrong_kind, "target.sglang.versioning"),
    ("verl", _nested_typo, "megatron_args.--fp8-format"),
    ("nemo_rl", _nested_typo, "megatron_args.--fp8-format"),
])
def test_a_broken_table_fails(name, break_it, where):
    table = copy.deepcopy(target_table(name))
    break_it(table)
    errors = _errors(name, table)
    assert errors and errors[0].startswith(where + ":"), errors
