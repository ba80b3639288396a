"""Settings records: what a target asks an engine for, and the contract rule that asked.

A target lowers a Plan to records, never to argv: each record is one engine setting (a command-line
flag, an environment variable, a Hydra key, the entry script) with its value, the contract path of
the rule that asked for it and, where the value needs a reason, a note. Printers turn records into
what an engine reads (argv words, `KEY=VALUE` environment, Hydra overrides); the frameworks (Miles,
verl) compose the Megatron, SGLang and vLLM records instead of re-parsing their argv, and `pcc diff`,
the engine-version checks (PCC614) and `--verify` read the records, so the rule that asked is there,
not reconstructed (docs/architecture.md "Settings records").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Union

# A flag's value: True for a bare flag, one word, or several words (`--lora-target-modules q_proj v_proj`);
# an environment variable's: a string; a Hydra key's: what YAML would hold (bool, number, string, list, null).
Value = Union[bool, int, float, str, tuple, None]

KINDS = ("entry", "flag", "env", "key")  # the entry script, an argv flag, an environment variable, a Hydra key


@dataclass(frozen=True, slots=True)
class Setting:
    engine: str  # who reads it: megatron, sglang, vllm, miles, verl
    kind: str  # one of KINDS
    key: str  # "--fp8-recipe", "NVTE_BACKWARD_OVERRIDE", "actor_rollout_ref.rollout.name", "train.py"
    value: Value
    path: str | None  # the contract path (rule) that asked for it; None: the target's own choice
    note: str | None = None

    def words(self) -> tuple[str, ...]:
        """A flag's value as argv words (none for a bare flag)."""
        if self.value is True:
            return ()
        return tuple(self.value) if isinstance(self.value, tuple) else (str(self.value),)

    def support_keys(self) -> list[str]:
        """What targets/engines.yaml `support` rows are keyed by: the flag, the flag with each value,
        the variable."""
        if self.kind == "flag":
            return [self.key] + [f"{self.key} {w}" for w in self.words()]
        return [self.key] if self.kind == "env" else []

    def shown(self) -> str:
        """The value as `pcc diff` shows it: words joined by a blank, "" for a bare flag."""
        return " ".join(self.words()) if self.kind == "flag" else hydra_value(self.value) if self.kind == "key" \
            else str(self.value)


def flag(engine: str, key: str, value: Value = True, path: str | None = None, note: str | None = None) -> Setting:
    if isinstance(value, list):
        value = tuple(value)
    return Setting(engine, "flag", key, value, path, note)


def env(engine: str, key: str, value: str, path: str | None = None, note: str | None = None) -> Setting:
    return Setting(engine, "env", key, str(value), path, note)


def argv(settings: Iterable[Setting]) -> list[str]:
    """The entry script and flags as argv, in record order; Hydra keys as `key=value` overrides."""
    out: list[str] = []
    for s in settings:
        if s.kind == "entry":
            out.append(str(s.value))
        elif s.kind == "flag":
            out += [s.key, *s.words()]
        elif s.kind == "key":
            out.append(f"{s.key}={hydra_value(s.value)}")
    return out


def environ(settings: Iterable[Setting]) -> dict[str, str]:
    """The environment variables, by name (the last record of a name wins)."""
    return {s.key: str(s.value) for s in settings if s.kind == "env"}


def hydra_value(v: Value) -> str:
    """A Hydra override value: booleans and null as YAML writes them, lists in brackets, every string
    quoted (Hydra reads a bare `0.5_2.0` as the float 0.52 and `1` as an int; Ray's env_vars take
    strings). Whether a string can be quoted at all is `hydra_quotable`, checked where the record is made."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return f"{v:g}" if isinstance(v, float) else str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(hydra_value(x) for x in v) + "]"
    return f"'{v}'"


def hydra_quotable(v: Value) -> bool:
    """Whether `hydra_value` can write `v`: Hydra's quoted strings take no quote or backslash."""
    if isinstance(v, (list, tuple)):
        return all(hydra_quotable(x) for x in v)
    return not isinstance(v, str) or not ("'" in v or "\\" in v)


def by_key(settings: Iterable[Setting]) -> dict[str, Setting]:
    """key -> record (the last of a key wins, as argparse and Hydra take it)."""
    return {s.key: s for s in settings}
