"""One engine table per engine, read both ways: lowering writes its records through it, `pcc import`
reads launches through it.

A table holds what an engine's own parser defines for each flag (canonical name, aliases, arity,
type, choices, default), generated from the engine's definitions and checked against the generator
in CI: SGLang's from its ServerArgs (targets/sglang_flags.json, tools/engine_flags.py); Miles' from
Miles' and its Megatron's argparse sources (targets/miles_flags.json, tools/miles_flags.py) plus
SGLang's flags as Miles registers them (`--sglang-` before every option string of a field it does
not skip). What an engine sets itself after parsing (Miles turns the distributed optimizer on for
Adam) is data beside it (targets/miles.yaml `applies`), so an import sees the setting the engine
runs and a lowering can tell when a contract asks for the opposite.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from pcc.resources import data_dir, target_table

PREFIX = "--sglang-"  # Miles' SGLang flags
_CONVERT = {"int": int, "float": float}  # the argparse types a value is checked against (others: the engine's own)


@dataclass(frozen=True)
class Flag:
    name: str  # the canonical option string
    nargs: object  # 0 (a switch), 1, "?", "+", "*" or a count
    type: str | None
    choices: tuple[str, ...] | None
    default: object = None


class EngineTable:
    def __init__(self, engine: str, flags: dict[str, Flag], aliases: dict[str, str], applies: list[dict],
                 negations: dict[str, str] | None = None):
        self.engine, self.flags, self._aliases, self.applies = engine, flags, aliases, applies
        self._negations = negations or {}

    def canonical(self, option: str) -> str:
        """The canonical option string of `option` (itself when it names no flag of the table)."""
        return self._aliases.get(option, option)

    def negated(self, option: str) -> str | None:
        """The switch `option` turns off (`--no-X` of a BooleanOptionalAction), None for any other option."""
        return self._negations.get(option)

    def spec(self, option: str) -> Flag | None:
        return self.flags.get(self.canonical(option))

    def problems(self, key: str, words: tuple[str, ...]) -> list[str]:
        """Why the engine's parser would not take `key words` (empty: it would): no such flag, the wrong
        number of values, a value outside its choices or not of its type."""
        spec = self.flags.get(key)
        if spec is None:
            return [f"no flag {key}" + (f" (its name is {self.canonical(key)})" if key in self._aliases else "")]
        n, out = spec.nargs, []
        if not (n == len(words) if isinstance(n, int) else len(words) <= 1 if n == "?" else
                len(words) >= (n == "+")):
            out.append(f"{key} takes {n} value(s), not {len(words)}")
        for w in words:
            if spec.choices is not None and w not in spec.choices:
                out.append(f"{key} {w}: not one of its choices ({', '.join(spec.choices)})")
            elif spec.type in _CONVERT:
                try:
                    _CONVERT[spec.type](w)
                except ValueError:
                    out.append(f"{key} {w}: not {'an' if spec.type == 'int' else 'a'} {spec.type}")
        return out

    def value(self, given: dict[str, list[str]], flag: str):
        """A flag's value in `given` (canonical flag -> words) as the engine reads it: its last word,
        True for a switch given, the parser's default when unset."""
        if flag in given:
            return given[flag][-1] if given[flag] else True
        spec = self.flags.get(flag)
        return spec.default if spec is not None else None

    def implied(self, given: dict[str, list[str]]) -> dict[str, list[str] | None]:
        """What the engine sets itself after parsing `given`, whatever `given` says: flag -> its words
        ([] a switch on, None off), from the `applies` rules."""
        return {rule["set"]: rule["value"] if all(self.value(given, k) in v for k, v in rule["when"].items())
                else rule["otherwise"] for rule in self.applies}

    def effective(self, given: dict[str, list[str]]) -> dict[str, list[str]]:
        """`given` as the engine runs it: the implied settings applied (a switch turned off is absent)."""
        out = dict(given)
        for flag, words in self.implied(given).items():
            if words is None:
                out.pop(flag, None)
            else:
                out[flag] = list(words)
        return out


@dataclass(frozen=True)
class Key:
    name: str  # the dotted path
    type: str | None  # bool, int, float, str, list, dict; None where the default is null or an interpolation
    default: object  # as the YAML writes it: interpolations unresolved, None for Hydra's MISSING ('???')


class KeyTable:
    """A Hydra engine's table (verl, targets/verl_keys.json): for each config its entry point composes,
    every key with its default and type; a job's overrides are read against the config it names."""

    MISSING = "???"  # OmegaConf's mandatory value: unset until the job sets it

    def __init__(self, engine: str, configs: dict[str, dict[str, dict]]):
        self.engine = engine
        self.keys = {name: {k: Key(k, d["type"], None if d["default"] == self.MISSING else d["default"])
                            for k, d in keys.items()} for name, keys in configs.items()}
        self._trees: dict[str, dict] = {}

    def config(self, name: str | None) -> str | None:
        """The config `--config-name NAME` composes (NAME with or without `.yaml`, as Hydra takes it); None
        when the table has no such config."""
        name = name.removesuffix(".yaml") if name else name
        return name if name in self.keys else None

    def canonical(self, option: str) -> str:
        """The key an override names: Hydra's `+key` (add), `++key` (force) and `~key` (delete) name `key`."""
        return option.lstrip("+~")

    def spec(self, key: str, config: str) -> Key | None:
        return self.keys[config].get(self.canonical(key))

    def default(self, key: str, config: str):
        """What the engine runs when the job leaves `key` unset (None for a key the config lacks)."""
        spec = self.spec(key, config)
        return spec.default if spec is not None else None

    def tree(self, config: str) -> dict:
        """The config as nested mappings (a leaf: its default), to walk a key part by part."""
        if config not in self._trees:
            root: dict = {}
            for key, spec in self.keys[config].items():
                *parents, leaf = key.split(".")
                node = root
                for p in parents:
                    node = node.setdefault(p, {})
                node[leaf] = spec.default
            self._trees[config] = root
        return self._trees[config]


def _flag(name: str, d: dict) -> Flag:
    choices = d.get("choices")
    return Flag(name, d["nargs"], d.get("type"), tuple(choices) if isinstance(choices, list) else None,
                d.get("default"))


def _read(name: str) -> dict:
    with open(data_dir("targets") / name, encoding="utf-8") as fh:
        return json.load(fh)


def _options(doc: dict, prefix: str = "", skipped: frozenset = frozenset()) -> tuple[dict, dict, dict]:
    """(flags, alias -> flag, negation -> flag) of a generated flag table, each option string written
    `prefix` + its name without dashes when a prefix is given (Miles' --sglang-<option>)."""
    name = (lambda o: prefix + o.lstrip("-")) if prefix else (lambda o: o)
    flags, aliases, negations = {}, {}, {}
    for k, d in doc.items():
        if d["dest"] in skipped:
            continue
        flags[name(k)] = _flag(name(k), d)
        aliases.update({name(a): name(k) for a in d["aliases"]})
        negations.update({name(n): name(k) for n in d.get("negations", ())})
    return flags, aliases, negations


@functools.cache
def table(engine: str) -> EngineTable:
    """The table of `engine`: sglang, vllm, miles (Miles' parser: Megatron's flags, Miles' own, and SGLang's
    as --sglang-<option>), or verl (a KeyTable: the keys of the Hydra configs its main_ppo composes)."""
    sglang = _read("sglang_flags.json")["flags"]
    if engine in ("sglang", "vllm"):
        flags, aliases, negations = _options(sglang if engine == "sglang" else _read("vllm_flags.json")["flags"])
        return EngineTable(engine, flags, aliases, [], negations)
    if engine == "verl":
        return KeyTable(engine, _read("verl_keys.json")["configs"])
    if engine != "miles":
        raise KeyError(f"no engine table for '{engine}' (tables: sglang, vllm, miles, verl)")
    miles = _read("miles_flags.json")
    flags = {k: _flag(k, d) for k, d in miles["flags"].items()}
    theirs, aliases, negations = _options(sglang, PREFIX, frozenset(miles["sglang_skipped"]))
    flags.update({k: f for k, f in theirs.items() if k not in flags})  # Miles' own --sglang-router-* first
    return EngineTable(engine, flags, aliases, target_table("miles").get("applies", []), negations)
