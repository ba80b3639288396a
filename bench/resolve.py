"""Resolution speed: 50 rules against a frontier-size MoE catalog (Kimi-K2 shape:
61 layers x 384 routed experts x 3 linears + attention, ~70k operators), beside
compressed-tensors' own target matching (`match_named_modules` over the same
names as meta-device modules, the same 50 rules as `re:` targets), measured in
the same run. Four sizes show how each grows with the operator count.

    python bench/resolve.py [--rounds 5] [--layers 8 16 32 61]   # baseline: pip install -e .[bench]

The two run interleaved, in an order that alternates each round; each keeps its best round.
"""

from __future__ import annotations

import argparse
import re

from machine import interleaved, machine
from pcc.contract.model import Contract
from pcc.lang.build import build
from pcc.lang.diagnostics import Reporter
from pcc.models import load_catalog
from pcc.models.builtin import catalog_from_config
from pcc.plan.patterns import parse_pattern
from pcc.plan.resolve import _groups, _match, resolve

# family -> regex over HF module names (DeepSeek-V3 / Kimi-K2 layout), for the baseline only
FAMILY_RX = {
    "attn.q": r"self_attn\.(q_a_proj|q_b_proj|q_proj)", "attn.kv": r"self_attn\.(kv_a_proj_with_mqa|kv_b_proj)",
    "attn.o": r"self_attn\.o_proj", "mlp.gate_up": r"mlp\.(gate_proj|up_proj)", "mlp.down": r"mlp\.down_proj",
    "experts.gate_up": r"mlp\.experts\.\d+\.(gate_proj|up_proj)", "experts.down": r"mlp\.experts\.\d+\.down_proj",
    "shared_experts.gate_up": r"mlp\.shared_experts\.(gate_proj|up_proj)",
    "shared_experts.down": r"mlp\.shared_experts\.down_proj", "router": r"mlp\.gate",
}


def contract_text(layers: int) -> str:
    """50 rules of the kinds real contracts use: layer-ranged expert rules, attention
    exceptions, tensor-name globs, keeps, trainer rules."""
    rules, step = [], max(1, layers // 20)
    for i in range(20):
        lo, hi = min(i * step, layers - 1), min(i * step + step - 1, layers - 1)
        rules.append(f"    experts.gate_up[{lo}..{hi}], experts.down[{lo}..{hi}] : {'fp8_block' if i % 2 else 'mxfp8'}")
    for i in range(10):
        lo = min(i * step, layers - 1)
        rules.append(f"    attn.q[{lo}..{min(lo + 1, layers - 1)}], attn.o[{lo}] : fp8_block")
    for i in range(5):
        rules.append(f'    "model.layers.{i + 1}*.mlp.experts.{i}*.down_proj.weight" : bf16')
    rules.append("    keep bf16 : router, lm_head")
    rules.append("    keep bf16 : linear[0, -1]")
    trainer = [f"    fprop experts.*[{i * step}..{i * step + step - 1}] : fp8_block qdq" for i in range(10)]
    trainer += ["    dgrad, wgrad : bf16", "    keep bf16 : router, shared_experts.*", "    wgrad attn : bf16"]
    body = "\n".join(rules)
    return (f"contract bench {{\n  model kimi_k2\n  hardware B200\n  rollout sglang {{\n{body}\n  }}\n"
            f"  trainer megatron {{\n" + "\n".join(trainer) + "\n  }\n}\n")


def rx_targets(pattern: str, num_layers: int) -> list[str]:
    """One pcc pattern as compressed-tensors `re:` targets over module names."""
    pat = parse_pattern(pattern)
    layers = pat.layer_set(num_layers)
    layer_rx = r"\d+" if layers is None else "(" + "|".join(str(i) for i in sorted(layers)) + ")"
    if pat.name_regex is not None:
        glob = pattern.split(":", 1)[1].removesuffix(".weight")
        return ["re:^" + re.escape(glob).replace(r"\*", ".*") + "$"]
    out = []
    for fam in pat.families:
        if fam in FAMILY_RX:
            out.append(f"re:^model\\.layers\\.{layer_rx}\\.{FAMILY_RX[fam]}$")
        elif fam == "lm_head":
            out.append("re:^lm_head$")
    return out


def meta_model(catalog):
    import torch

    root = torch.nn.Module()
    with torch.device("meta"):
        for op in catalog.operators:
            if len(op.shape) != 2 or not op.tensor.endswith(".weight"):
                continue
            *parents, leaf = op.tensor[: -len(".weight")].split(".")
            mod = root
            for p in parents:
                child = mod._modules.get(p)
                if child is None:
                    child = torch.nn.Module()
                    mod.add_module(p, child)
                mod = child
            mod.add_module(leaf, torch.nn.Linear(op.shape[1], op.shape[0], bias=False))
    return root


def _has_compressed_tensors() -> bool:
    try:
        from compressed_tensors.utils import match_named_modules  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, nargs="+", default=[8, 16, 32, 61])
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds; each method keeps its best")
    ap.add_argument("--no-baseline", action="store_true")
    args = ap.parse_args()
    baseline = not args.no_baseline and _has_compressed_tensors()
    print(machine())
    if not args.no_baseline and not baseline:
        print("compressed-tensors is not installed (pip install -e .[bench]): pcc alone")
    print(f"best of {args.rounds} rounds, pcc and compressed-tensors interleaved in alternating order")
    base = load_catalog("kimi_k2").config
    print(f"{'layers':>6} {'operators':>9} {'rules':>5} {'pcc resolve':>12} {'ops/s':>12} "
          f"{'compressed-tensors':>19} {'speedup':>8}")
    for layers in args.layers:
        catalog = catalog_from_config(f"kimi_k2_{layers}l", {**base, "num_hidden_layers": layers})
        rep = Reporter()
        d, smap = build(contract_text(layers), "bench.prec", rep)
        contract = Contract.model_validate(d)
        nrules = len(contract.rollout.rules) + len(contract.trainer.rules)
        methods = {"pcc": lambda: resolve(contract, catalog, smap, Reporter())}
        found: set[str] = set()
        if baseline:
            from compressed_tensors.utils import match_named_modules

            model = meta_model(catalog)
            targets = [t for r in contract.rollout.rules + contract.trainer.rules
                       for p in r.patterns for t in rx_targets(p, layers)]

            def theirs():
                found.clear()
                found.update(name for name, _ in match_named_modules(model, targets))

            methods["compressed-tensors"] = theirs
        best = interleaved(methods, args.rounds)
        ours = best["pcc"]
        line = f"{layers:>6} {len(catalog.operators):>9} {nrules:>5} {ours * 1e3:>10.1f}ms " \
               f"{len(catalog.operators) / ours:>12,.0f}"
        if baseline:
            # Same question, same answer: the operators any rule matches (before precedence).
            groups, nl = _groups(catalog)
            mine: set[str] = set()
            for r in contract.rollout.rules + contract.trainer.rules:
                for p in r.patterns:
                    keys, names = _match(parse_pattern(p), groups, nl, catalog.operators)
                    idx = [i for k in keys for i in groups[k]] + names
                    mine.update(catalog.operators[i].tensor[: -len(".weight")] for i in idx
                                if catalog.operators[i].family not in ("norm", "embed", "kv_cache", "other"))
            assert mine == found, f"matchers disagree on {len(mine ^ found)} modules"
            theirs_s = best["compressed-tensors"]
            line += f" {theirs_s * 1e3:>17.0f}ms {theirs_s / ours:>7.0f}x"
        print(line, flush=True)
    print("after: " + machine())


if __name__ == "__main__":
    main()
