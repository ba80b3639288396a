"""The typed contract: pydantic model, YAML/JSON IO, extends, schema export."""

from pcc.contract.io import Loaded, canonical, export, load
from pcc.contract.model import Contract, SchemeSpec
from pcc.contract.presets import lookup

__all__ = ["Contract", "Loaded", "SchemeSpec", "canonical", "export", "load", "lookup"]
