"""The engine arguments a change moves: both plans lowered through `pcc.lower.lower`.

Targets are written and registered separately; one that is not available yet (or
fails to lower) is reported as a note instead of failing the diff.
"""

from __future__ import annotations

from pcc.diff import ENGINE_TARGETS
from pcc.diff.compare import field_changes
from pcc.plan import Plan


def flags(args: list[str]) -> dict[str, str]:
    """argv -> {flag: value}; a bare flag maps to "" and repeats join with " | "."""
    out: dict[str, str] = {}
    key = None
    for tok in args:
        if tok.startswith("--"):
            key, _, inline = tok.partition("=")
            out[key] = out[key] + " | " + inline if key in out else inline
        elif key is not None:
            out[key] = (out[key] + " " + tok).strip()
        else:
            out[tok] = ""  # a positional before any flag
    return out


def _lower(plan: Plan, name: str):
    from pcc.lower import lower

    try:
        return lower(plan, name), None
    except (KeyError, ImportError) as exc:
        return None, f"target '{name}' is not available ({exc}); its arguments are not compared"
    except Exception as exc:  # a target that rejects one of the plans: say so, keep the rest of the diff
        return None, f"target '{name}' failed to lower: {type(exc).__name__}: {exc}"


def engine_changes(pa: Plan, pb: Plan, targets=ENGINE_TARGETS) -> dict[str, dict]:
    out = {}
    for name in targets:
        la, note_a = _lower(pa, name)
        lb, note_b = _lower(pb, name)
        if la is None or lb is None:
            out[name] = {"available": False, "note": note_a or note_b}
            continue
        files = sorted(set(la.files) | set(lb.files))
        out[name] = {"available": True,
                     "args": field_changes(flags(la.args), flags(lb.args)),
                     "env": field_changes(la.env, lb.env),
                     "files": [{"path": f, "change": "added" if f not in la.files else
                                "removed" if f not in lb.files else "changed"}
                               for f in files if la.files.get(f) != lb.files.get(f)]}
    return out
