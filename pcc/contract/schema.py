"""JSON Schemas generated from the pydantic model; checked in under schemas/."""

from __future__ import annotations

import json

from pcc.contract.model import Contract

SCHEMA_ID = "https://pcc.dev/schemas/contract.schema.json"


def contract_schema() -> dict:
    schema = Contract.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = SCHEMA_ID
    schema["title"] = "pcc precision contract"
    return schema


def schema_files() -> dict[str, str]:
    return {"contract.schema.json": json.dumps(contract_schema(), indent=2, sort_keys=True) + "\n"}
