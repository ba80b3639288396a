"""The typed contract: pydantic model, the scheme model, YAML/JSON IO, extends, schema export."""

from pcc.contract.io import Loaded, canonical, export, load
from pcc.contract.model import Contract
from pcc.contract.scheme import Grouping, Scheme, lookup, preset

__all__ = ["Contract", "Grouping", "Loaded", "Scheme", "canonical", "export", "load", "lookup", "preset"]
