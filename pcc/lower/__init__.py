"""Lowering: Plan -> artifacts for one target. One module per target, registered by name.

A target is a name, the contract fields it honours, and a pure function `Plan ->
Lowered`. What it cannot express it reports with `unsupported(code, message, path)`:
a coded diagnostic on the contract path (the rule) that asked for it, never a bare
exception. `lower_all` runs every target a contract names and turns those into
diagnostics; `pcc check` runs it too, so a contract that checks always compiles.
A target never imports an engine at module import time (engine parsers are used only
by `pcc.lower.verify_*`, lazily).
Paths to user data (checkpoints) never appear in `args`: run scripts supply them
from the environment variables in `PATH_VARIABLES`, so a bundle is relocatable
and byte-identical for the same input.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import weakref
from dataclasses import dataclass, field, replace
from typing import Callable, NoReturn

from pcc.lang.diagnostics import PccError, Reporter
from pcc.lower.settings import Setting, argv, environ
from pcc.plan import Compiled, Plan, compile_file as _resolve_file

# Environment variables through which run scripts receive paths (with defaults in run.sh).
PATH_VARIABLES = {
    "PCC_ROLLOUT_CHECKPOINT": "the rollout artifact the converter plan builds (HF layout, quantized)",
    "PCC_REF_LOAD": "the BF16 trainer weights (Megatron checkpoint or HF directory)",
    "PCC_SOURCE_CHECKPOINT": "the BF16/FP32 Hugging Face checkpoint the converter reads",
    "PCC_ADAPTER": "a LoRA adapter directory (PEFT layout), for adapter contracts",
}

# The job file beside a bundle (the job's own data, batch sizes, steps: never in the bundle), read by
# the framework launches, Miles' and verl's: $<framework's variable> names it, else this file in the
# directory holding the bundle.
JOB_FILE = "job"


def job_file_shell(variable: str) -> str:
    """launch.sh lines that set $job as both framework launches resolve it: ${variable} when set (empty:
    none; a file that does not exist stops the launch, exit 2), else JOB_FILE beside "$bundle"."""
    return (f'job="${{{variable}-$(dirname "$bundle")/{JOB_FILE}}}"\n'
            f'if [[ -n "${{{variable}:-}}" && ! -f "${variable}" ]]; then\n'
            f'  echo "error: {variable}=${variable}: no such file" >&2\n'
            "  exit 2\n"
            "fi\n")


@dataclass
class Lowered:
    """What one target needs: its settings records (pcc.lower.settings), and files for the bundle."""

    target: str
    settings: list[Setting] = field(default_factory=list)  # in the order the engine reads them
    files: dict[str, str] = field(default_factory=dict)  # bundle-relative path -> text
    notes: list[str] = field(default_factory=list)  # why each non-obvious value was chosen
    # contract fields this target lowers only partly: reported as warnings with their code
    caveats: list["Unsupported"] = field(default_factory=list)

    @property
    def args(self) -> list[str]:
        """The records as argv after the program name (verl: Hydra overrides), printed."""
        return argv(self.settings)

    @property
    def env(self) -> dict[str, str]:
        return environ(self.settings)

    def of(self, kind: str) -> list[Setting]:
        return [s for s in self.settings if s.kind == kind]

    def value(self, key: str, default=None):
        """The value of the last record of `key` (None: none)."""
        return next((s.value for s in reversed(self.settings) if s.key == key), default)


def module_leaf(tensor: str) -> str:
    """HF tensor name -> the module's leaf name, as engines match LoRA targets
    ("model.layers.3.self_attn.q_proj.weight" -> "q_proj")."""
    return tensor.removesuffix(".weight").rsplit(".", 1)[-1]


class Unsupported(PccError):
    """What a target cannot express (PCC6xx, or the checker's code for the same fact)."""


class Refused(Unsupported):
    """Every refusal of one target's lowering (`found`), first one's text as its own."""

    def __init__(self, found: list[Unsupported]):
        first = found[0]
        super().__init__(first.message, first.code, first.path, first.hint)
        self.found = found


# The refusals of the target being lowered (`lower` sets it): `refuse` adds to it and lowering goes on,
# so `pcc check` reports every refusal, each on its rule (sqlglot's ErrorLevel.RAISE, not IMMEDIATE).
_REFUSALS: contextvars.ContextVar[list[Unsupported] | None] = contextvars.ContextVar("refusals", default=None)


def unsupported(code: str, message: str, path: str | None = None, hint: str | None = None) -> NoReturn:
    """A refusal after which the target cannot go on (what it would write next depends on it)."""
    raise Unsupported(message, code, path, hint)


def refuse(code: str, message: str, path: str | None = None, hint: str | None = None) -> None:
    """A refusal the target can go on past: collected, and the target lowers the rest, so one
    `pcc check` shows every refusal. Outside `lower` (a target function called directly) it raises."""
    found = _REFUSALS.get()
    if found is None:
        unsupported(code, message, path, hint)
    found.append(Unsupported(message, code, path, hint))


TargetFn = Callable[[Plan], Lowered]


@dataclass(frozen=True)
class Target:
    name: str
    honours: tuple[str, ...]  # contract fields (dotted paths) this target turns into engine state
    fn: TargetFn


# name -> module; a module registers its target with @target(name, honours=...) when imported.
TARGET_MODULES = {
    "megatron": "pcc.lower.megatron",
    "fsdp": "pcc.lower.fsdp",
    "sglang": "pcc.lower.sglang",
    "vllm": "pcc.lower.vllm",
    "converter": "pcc.lower.converter",
    "expectations": "pcc.lower.expectations",
    "miles": "pcc.lower.miles",
    "verl": "pcc.lower.verl",
    "nemo_rl": "pcc.lower.nemo_rl",
}
_TARGETS: dict[str, Target] = {}


def target(name: str, honours: tuple[str, ...] = ()) -> Callable[[TargetFn], TargetFn]:
    def register(fn: TargetFn) -> TargetFn:
        _TARGETS[name] = Target(name, honours, fn)
        return fn

    return register


def get_target(name: str) -> Target:
    if name not in _TARGETS:
        if name not in TARGET_MODULES:
            raise KeyError(f"unknown target '{name}' (targets: {', '.join(TARGET_MODULES)})")
        importlib.import_module(TARGET_MODULES[name])
    return _TARGETS[name]


def targets_for(plan: Plan) -> tuple[str, ...]:
    """The targets a contract names: its rollout engine, its trainer engine where pcc lowers it,
    the converter and the expectations, and the framework that launches them (`Contract.runs_on`:
    the one it names, else Miles for Megatron + SGLang)."""
    c = plan.contract
    names = [c.rollout.engine]
    if not (c.trainer.engine == "fsdp" and c.runs_on in ("verl", "nemo_rl")):  # they configure their own FSDP
        names.append(c.trainer.engine)
    names += ["converter", "expectations"]
    if c.runs_on is not None:
        names.append(c.runs_on)
    return tuple(n for n in TARGET_MODULES if n in names)


def lower(plan: Plan, name: str) -> Lowered:
    """Lower `plan` for target `name` (see TARGET_MODULES); raises Unsupported when the target
    cannot express the plan (run `lower_all` first to get that as diagnostics).

    Lowering is a pure function of the Plan, so each target runs once per Plan (Miles
    composes the megatron and sglang records; a bundle needs all of them): the results are
    kept beside the Plan, not on it, for as long as the Plan lives. Treat them as read-only.
    When the target refuses, the Refused raised holds every refusal it found.
    """
    cache = _cache(plan)
    if name not in cache:
        found: list[Unsupported] = []
        token = _REFUSALS.set(found)
        try:
            cache[name] = get_target(name).fn(plan)
        except Unsupported as exc:
            found.append(exc)
        finally:
            _REFUSALS.reset(token)
        if found:  # a nested target's Refused (Miles lowering megatron) brings all of its own
            cache[name] = Refused([e for exc in found for e in (exc.found if isinstance(exc, Refused) else [exc])])
    if isinstance(cache[name], Unsupported):
        raise cache[name]
    return cache[name]


def lower_each(plan: Plan, *names: str) -> tuple[Lowered, ...]:
    """Lower every target in `names` (what a framework composes) before reporting: one Refused with
    the refusals of all of them, not only the first target's."""
    out, found = [], []
    for name in names:
        try:
            out.append(lower(plan, name))
        except Refused as exc:
            found += exc.found
    if found:
        raise Refused(found)
    return tuple(out)


_LOWERED: dict[int, dict] = {}  # id(plan) -> target -> Lowered or Refused, dropped with the Plan


def _cache(plan: Plan) -> dict:
    key = id(plan)
    if key not in _LOWERED:
        _LOWERED[key] = {}
        weakref.finalize(plan, _LOWERED.pop, key, None)
    return _LOWERED[key]


def once(fn):
    """`fn(plan)`, a pure function of the Plan that several targets read (the converter plan, the modules
    rollout keeps wide), computed once per Plan and kept beside it as its lowerings are; read-only. An
    exception is raised again by the next call, not kept."""
    key = f"{fn.__module__}.{fn.__qualname__}"  # (no target's name)

    @functools.wraps(fn)
    def kept(plan: Plan):
        cache = _cache(plan)
        if key not in cache:
            cache[key] = fn(plan)
        return cache[key]

    return kept


def lower_all(plan: Plan, rep: Reporter, names: tuple[str, ...] | None = None) -> dict[str, Lowered]:
    """Lower every target `names` (default: the contract's); what a target cannot express goes to
    `rep` as a diagnostic positioned on the contract path that asked for it."""
    out, seen = {}, set()
    for name in targets_for(plan) if names is None else names:
        try:
            out[name] = lower(plan, name)
        except Refused as exc:
            found = [(e, "error") for e in exc.found]
        else:
            found = [(w, "warning") for w in out[name].caveats]
        for exc, severity in found:
            key = (exc.code, exc.message)
            if key not in seen:  # Miles re-raises what megatron or sglang reported
                seen.add(key)
                d = exc.diagnostic(plan.smap.find(exc.path) if exc.path else None)
                rep.diagnostics.append(replace(d, severity=severity))
    return out


def compile_file(path: str, catalog=None, text: str | None = None) -> Compiled:
    """Load, resolve, check and lower one contract for every target it names: what `pcc check`
    and every verb that writes or runs a contract use (`text`: the file's unsaved contents, as the
    language server has them). Never raises for bad input."""
    c = _resolve_file(path, catalog, text)
    if c.ok:
        rep = Reporter()
        lower_all(c.plan, rep)
        c = replace(c, diagnostics=c.diagnostics + [d if d.span else replace(d, file=path) for d in rep.diagnostics])
    return c
