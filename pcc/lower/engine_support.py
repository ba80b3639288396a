"""What the engine versions pcc targets support (targets/engines.yaml), checked where a target emits it.

The contract names engines, not versions: every bundle targets the versions in
targets/engines.yaml `target` (docs/miles.md "Engine versions": how to target another). A target passes what it
emits (its settings records: flags with their values, environment variables) to `check`; a flag,
value or variable the targeted version does not have yet is PCC614 on the contract path the record
names. What Miles runs per GPU architecture (`miles_hardware`) is a separate fact from the
GPU's own formats (targets/hardware.yaml): `miles_hardware_modes` gives it for the target.
"""

from __future__ import annotations

import functools
import re
from typing import Iterable

from pcc.lower import refuse
from pcc.lower.engine_table import table as engine_table
from pcc.lower.settings import Setting
from pcc.resources import target_table


@functools.cache
def table() -> dict:
    return target_table("engines")


def targeted(engine: str) -> str:
    """The version of `engine` pcc lowers for."""
    return str(table()["target"][engine]["version"])


def _key(engine: str, version: str) -> tuple:
    """An orderable form of `version`: dotted release numbers, or an ISO date."""
    kind = table()["target"][engine]["versioning"]
    if kind == "date":
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", version):
            raise ValueError(f"{engine} version {version!r} is not a YYYY-MM-DD commit date")
        return (version,)
    if not re.fullmatch(r"\d+(\.\d+)*", version):
        raise ValueError(f"{engine} version {version!r} is not a dotted release number")
    return tuple(int(p) for p in version.split("."))


def older(engine: str, version: str, than: str) -> bool:
    return _key(engine, version) < _key(engine, than)


def missing(engine: str, keys: list[str]) -> list[tuple[str, dict]]:
    """The (key, row) of every key the targeted version of `engine` does not have yet."""
    rows, have = table()["support"].get(engine, {}), targeted(engine)
    return [(k, rows[k]) for k in keys if k in rows and older(engine, have, str(rows[k]["since"]))]


def check(engine: str, settings: Iterable[Setting], name: str) -> None:
    """PCC614 on every record whose flag, flag value or variable the targeted version of `engine` lacks,
    on the contract path the record says asked for it; `name` is the engine as the message says it."""
    have = targeted(engine)
    for s in settings:
        for key, row in missing(engine, s.support_keys()):
            refuse("PCC614", f"{name} {have} (targets/engines.yaml) has no {key}: it needs {name} "
                   f"{row['since']} or newer ({row['source']})", s.path,
                   hint=f"target a newer {name} in targets/engines.yaml (docs/miles.md, 'Engine versions'), or ask "
                        "the contract for something this version runs")


def check_flags(engine: str, settings: Iterable[Setting], name: str) -> None:
    """PCC614 on every flag record the engine's own parser would not take (its engine table,
    pcc.lower.engine_table): lowering writes through the table, so a flag an engine renamed or a value it
    no longer accepts is a refusal on the rule that asked, not a launch that fails."""
    tab = engine_table(engine)
    for s in settings:
        if s.kind == "flag":
            for why in tab.problems(s.key, s.words()):
                refuse("PCC614", f"{name}'s parser (targets/{engine}_flags.json) refuses it: {why}", s.path,
                       hint="regenerate the engine table (tools/engine_flags.py) or fix the target's table")


def miles_hardware_modes(arch: str) -> dict | None:
    """What the targeted Miles runs per side on GPU architecture `arch` ({"rollout": [...],
    "trainer": [...], "source": ...}); None where no restriction is known."""
    rows = table()["miles_hardware"].get(arch)
    if not rows:
        return None
    have = targeted("miles")
    fit = [r for r in rows if not older("miles", have, str(r["since"]))]
    return max(fit, key=lambda r: _key("miles", str(r["since"]))) if fit else {"rollout": [], "trainer": [],
                                                                              "source": "no Miles row that old"}
