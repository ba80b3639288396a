"""Model catalogs: architecture -> operators -> HF tensor names and shapes.

A ``.prec`` contract names operators by family; these catalogs say which
real tensors each family covers, from a built-in config or a checkpoint
directory (headers only, no tensor data, no torch).
"""

from pcc.models.base import FAMILIES, CatalogError, Operator
from pcc.models.builtin import catalog_names, close_names, load_catalog
from pcc.models.catalog import Catalog
from pcc.models.checkpoint import catalog_from_checkpoint

__all__ = [
    "FAMILIES", "Operator", "Catalog", "load_catalog", "catalog_names", "close_names",
    "catalog_from_checkpoint", "CatalogError",
]
