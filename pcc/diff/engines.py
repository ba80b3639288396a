"""The engine arguments a change moves: the targets each side's bundle holds, lowered through
`pcc.lower.lower` and compared as lowered: their settings records (flags, Hydra keys, environment),
never argv parsed back, and their files (a JSON file such as trainer/fsdp.json field by field).

By default the targets are those either bundle lowers (`pcc.lower.targets_for`), less the converter
and the expectations, which the Rollout and Expectations sections already compare semantically. A
target only one side lowers is compared against nothing (every argument added or removed). One
that is not available (or fails to lower) is reported as a note instead of failing the diff.
"""

from __future__ import annotations

import json

from pcc.diff.compare import field_changes
from pcc.plan import Plan

SEMANTIC_ELSEWHERE = ("converter", "expectations")  # the diff's own sections cover what these write


def settings_view(settings) -> tuple[dict[str, str], dict[str, str]]:
    """A target's settings records as ({key: value as shown}, {variable: value}): a key set twice shows
    both values joined by " | " (a repeated flag), a bare flag shows ""."""
    keys: dict[str, str] = {}
    env: dict[str, str] = {}
    for s in settings:
        if s.kind == "env":
            env[s.key] = s.shown()
        else:
            keys[s.key] = keys[s.key] + " | " + s.shown() if s.key in keys else s.shown()
    return keys, env


def json_changes(a, b, path: str = "") -> list[dict]:
    """Leaves of two JSON documents that differ, by dotted path (`list[i]` for a list of objects);
    a list of plain values is one leaf."""
    if isinstance(a, dict) or isinstance(b, dict):
        a, b = a if isinstance(a, dict) else {}, b if isinstance(b, dict) else {}
        return [c for k in sorted(set(a) | set(b))
                for c in json_changes(a.get(k), b.get(k), f"{path}.{k}" if path else k)]
    if _objects(a) or _objects(b):
        a, b = a if isinstance(a, list) else [], b if isinstance(b, list) else []
        return [c for i in range(max(len(a), len(b)))
                for c in json_changes(a[i] if i < len(a) else None, b[i] if i < len(b) else None, f"{path}[{i}]")]
    return [] if a == b else [{"field": path, "from": a, "to": b}]


def _objects(v) -> bool:
    return isinstance(v, list) and any(isinstance(x, (dict, list)) for x in v)


def _lower(plan: Plan, name: str):
    from pcc.lower import lower

    try:
        return lower(plan, name), None
    except (KeyError, ImportError) as exc:
        return None, f"target '{name}' is not available ({exc}); its arguments are not compared"
    except Exception as exc:  # a target that rejects one of the plans: say so, keep the rest of the diff
        return None, f"target '{name}' failed to lower: {type(exc).__name__}: {exc}"


def lowered_targets(pa: Plan, pb: Plan) -> list[tuple[str, bool, bool]]:
    """(target, A lowers it, B lowers it) for every engine target either bundle holds, in
    TARGET_MODULES order."""
    from pcc.lower import TARGET_MODULES, targets_for

    ta, tb = set(targets_for(pa)), set(targets_for(pb))
    return [(n, n in ta, n in tb) for n in TARGET_MODULES if (n in ta or n in tb) and n not in SEMANTIC_ELSEWHERE]


def _file_change(path: str, a: str | None, b: str | None) -> dict:
    change = {"path": path, "change": "added" if a is None else "removed" if b is None else "changed"}
    if path.endswith(".json"):
        change["fields"] = json_changes(json.loads(a) if a else None, json.loads(b) if b else None)
    return change


def engine_changes(pa: Plan, pb: Plan, targets=None) -> dict[str, dict]:
    """target -> what its lowered arguments, environment and files change from A to B; `targets`
    names targets to lower on both sides instead of the ones the bundles hold."""
    sides = lowered_targets(pa, pb) if targets is None else [(n, True, True) for n in targets]
    out = {}
    for name, in_a, in_b in sides:
        la, note_a = _lower(pa, name) if in_a else (None, None)
        lb, note_b = _lower(pb, name) if in_b else (None, None)
        if note_a or note_b:
            out[name] = {"available": False, "note": note_a or note_b}
            continue
        (args_a, env_a), (args_b, env_b) = (settings_view(lo.settings if lo else ()) for lo in (la, lb))
        files_a, files_b = (lo.files if lo else {} for lo in (la, lb))
        out[name] = {"available": True, "lowered_by": "both" if in_a and in_b else "A only" if in_a else "B only",
                     "args": field_changes(args_a, args_b),
                     "env": field_changes(env_a, env_b),
                     "files": [_file_change(f, files_a.get(f), files_b.get(f)) for f in sorted(set(files_a) | set(files_b))
                               if files_a.get(f) != files_b.get(f)]}
    return out
