"""Pair the operators of two catalogs, so a new model version (more layers, more
experts) diffs tensor by tensor. Operators match by (family, layer, expert,
projection): the projection is the tensor name with its numeric segments folded,
so `model.layers.3.mlp.experts.7.up_proj.weight` is `up_proj` of expert 7 in
layer 3 on either side. Identical catalogs (the common case) skip the work."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from pcc.models import Catalog

_NUMBER = re.compile(r"(?<=\.)\d+(?=\.)")


@dataclass
class Alignment:
    a: Sequence[int]  # operator indices in A ...
    b: Sequence[int]  # ... paired position by position with these in B
    only_a: list[int]
    only_b: list[int]
    same: bool  # one catalog: a and b are both range(n)

    def to_b(self, indices_a) -> set[int]:
        """A's operator indices as B's (operators that exist only in A drop out)."""
        if self.same:
            return set(indices_a)
        pair = dict(zip(self.a, self.b))
        return {pair[i] for i in indices_a if i in pair}


def _keys(catalog: Catalog) -> list[tuple]:
    keys = [(op.family, op.layer, op.expert, _NUMBER.sub("#", op.tensor)) for op in catalog.operators]
    if len(set(keys)) != len(keys):  # a name with more numbers than layer and expert: match by name
        keys = [(op.family, op.layer, op.expert, op.tensor) for op in catalog.operators]
    return keys


def align(ca: Catalog, cb: Catalog) -> Alignment:
    if ca is cb or ca.operators == cb.operators:
        n = range(len(ca.operators))
        return Alignment(n, n, [], [], True)
    ka, kb = _keys(ca), _keys(cb)
    where_b = {k: i for i, k in enumerate(kb)}
    a, b, only_a = [], [], []
    for i, k in enumerate(ka):
        j = where_b.pop(k, None)
        if j is None:
            only_a.append(i)
        else:
            a.append(i)
            b.append(j)
    return Alignment(a, b, only_a, sorted(where_b.values()), False)
