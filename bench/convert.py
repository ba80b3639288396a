"""Block-FP8 conversion of a generated ~2 GB BF16 checkpoint: `pcc convert` beside the I/O floor and the
converters a user would pick instead, interleaved, on the machine as it is.

    python bench/convert.py [--rounds 3] [--busy [N]] [--layers 4]   # generates the checkpoint once under $TMPDIR
    python bench/convert.py --calibration          # tiny_moe, dense 166M, MoE 494M, dense 886M (~3.1 GB under $TMPDIR)
    python bench/convert.py --memory [--baseline DIR]   # peak RSS with 512 MiB weights, per layout and source

Methods, each run in its own process (so its peak RSS is its own), all writing durably (every output
file fsynced before the clock stops):
- floor: safetensors `load_file` + `save_file` of every shard, unchanged (plain read + write);
- straightforward: one shard at a time, the whole-tensor block-FP8 quantizer of bench/quantize.py;
- pcc: `pcc.convert.run.convert` (fp8_block, embed and lm_head kept BF16);
- llm-compressor: `model_free_ptq(scheme="FP8_BLOCK", ignore=["lm_head"])` on the CPU, when the python
  given by --llmcompressor-python (default: this one) can import it (`pip install -e .[bench]`); it
  does not fsync, so the bench fsyncs its files and counts that.
Each round runs every method once, in an order that alternates each round; each method keeps its
best round, with that round's CPU seconds (user + kernel time of all its threads: where neighbours
hold the cores, a method's time follows them). Cores and load average are printed before and after. `--busy` runs a CPU-bound process
beside it all.
`--calibration`: the cost of NVFP4 input-scale calibration (docs/convert.md "Input scales"), each
generated source converted to NVFP4 without and with `calibrate`, each conversion in its own process.
`--memory`: peak RSS of `pcc convert` (no calibration) of a one-layer dense model whose MLP weights are
512 MiB each in BF16 ([65536, 4096]), per rollout layout whose scale needs the whole tensor and per
quantized source (made from the BF16 one by `pcc convert`), and of one MoE layer's 32 experts
[4096, 4096] to MXFP4 (fused `gate_up_proj_blocks` of 512 MiB); `--baseline DIR` also runs each with the
pcc of another checkout (e.g. `git archive` of an older commit), side by side.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import add_busy, busy, machine, order

ROOT = Path(tempfile.gettempdir()) / "pcc-bench-convert"
# --layers N (handed to the children as PCC_BENCH_LAYERS): the same shapes with N decoder layers
LAYERS = int(os.environ.get("PCC_BENCH_LAYERS", "4"))
SRC = ROOT / ("src" if LAYERS == 4 else f"src-{LAYERS}-layers")
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
          "intermediate_size": 14336, "num_hidden_layers": LAYERS, "num_attention_heads": 32, "num_key_value_heads": 8,
          "head_dim": 128, "vocab_size": 16384, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
          "torch_dtype": "bfloat16"}
CONTRACT = """contract bench-fp8 {
  model llama3_8b
  hardware H100
  rollout sglang {
    linear : fp8_block
    keep bf16 : embed, lm_head, norm
  }
  trainer megatron { gemm : bf16 optimizer adam }
  trainable all
  sync full_weights { schedule colocated bridge bf16 activation atomic }
}
"""
_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "head_dim": 128, "vocab_size": 32000,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "max_position_embeddings": 4096,
          "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
# label -> config.json of a generated BF16 source ("tiny_moe": the shipped catalog's own config)
CALIBRATION = {
    "tiny_moe": "tiny_moe",
    "dense 166M": {**_LLAMA, "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 6,
                   "num_attention_heads": 8, "num_key_value_heads": 8},
    "MoE 494M (32 experts)": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                              "hidden_size": 1024, "intermediate_size": 4096, "moe_intermediate_size": 512,
                              "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
                              "head_dim": 128, "vocab_size": 32000, "num_experts": 32, "num_experts_per_tok": 2,
                              "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
                              "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
                              "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
                              "torch_dtype": "bfloat16"},
    "dense 886M": {**_LLAMA, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 12,
                   "num_attention_heads": 16, "num_key_value_heads": 8},
}


MEMORY_ROOT = ROOT / "memory"
MEMORY_CONFIG = {**_LLAMA, "hidden_size": 4096, "intermediate_size": 65536, "num_hidden_layers": 1,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 1024}
# one MoE layer of 32 experts [4096, 4096]: its fused MXFP4 gate_up_proj_blocks are 512 MiB
MEMORY_MOE = {**CALIBRATION["MoE 494M (32 experts)"], "hidden_size": 4096, "moe_intermediate_size": 4096,
              "num_hidden_layers": 1, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 1024}
# label -> (source: "bf16", or the scheme the BF16 source is first converted into; rollout scheme; hardware)
MEMORY = {
    "bf16 -> fp8_block": ("bf16", "fp8_block", "H100"),
    "bf16 -> fp8_tensor": ("bf16", "fp8_tensor", "H100"),
    "bf16 -> nvfp4": ("bf16", "nvfp4", "B200"),
    "fp8_block -> nvfp4": ("fp8_block", "nvfp4", "B200"),
    "fp8_tensor -> nvfp4": ("fp8_tensor", "nvfp4", "B200"),
    "nvfp4 -> fp8_block": ("nvfp4", "fp8_block", "B200"),
    "int4_g128 -> fp8_block": ("int4_g128", "fp8_block", "H100"),
    "fp8_block -> fp8_block": ("fp8_block", "fp8_block", "H100"),  # copied bit for bit
    "nvfp4 -> nvfp4": ("nvfp4", "nvfp4", "B200"),  # copied bit for bit
    "MoE bf16 -> mxfp4 experts": ("moe", "mxfp4", "GB300"),
}
_HARDWARE = {"fp8_block": "H100", "fp8_tensor": "H100", "int4_g128": "H100", "nvfp4": "B200"}


def memory_contract(src: Path, scheme: str, hardware: str) -> Path:
    path = src.parent / f"{src.name}-to-{scheme}.prec"
    rules = "experts : mxfp4" if scheme == "mxfp4" else f"linear : {scheme}\n    keep bf16 : embed, lm_head, norm"
    path.write_text(f'contract mem {{\n  model from "{src}"\n  hardware {hardware}\n  rollout sglang {{\n'
                    f"    {rules}\n  }}\n"
                    "  trainer megatron {\n    gemm : bf16\n    optimizer adam\n  }\n  trainable all\n"
                    "  sync full_weights { schedule colocated bridge bf16 activation atomic }\n"
                    + ("  routing replay rollout\n" if scheme == "mxfp4" else "") + "}\n")
    return path


def memory_source(kind: str) -> Path:
    """The BF16 source, or it converted into `kind` (made once, by this checkout's pcc)."""
    from pcc.convert.run import convert

    if kind == "moe":
        generate(MEMORY_ROOT / "moe", MEMORY_MOE)
        return MEMORY_ROOT / "moe"
    bf16 = MEMORY_ROOT / "bf16"
    generate(bf16, MEMORY_CONFIG)
    if kind == "bf16":
        return bf16
    src = MEMORY_ROOT / kind
    if not (src / "pcc_convert.json").is_file():
        convert(str(memory_contract(bf16, kind, _HARDWARE[kind])), str(bf16), str(src), force=True, calibrate=False)
    return src


def memory_child(label: str) -> None:
    from pcc.convert.run import convert

    kind, scheme, hardware = MEMORY[label]
    src = MEMORY_ROOT / kind
    dst = MEMORY_ROOT / "out"
    shutil.rmtree(dst, ignore_errors=True)
    t0 = time.perf_counter()
    convert(str(memory_contract(src, scheme, hardware)), str(src), str(dst), calibrate=False)
    secs = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    shutil.rmtree(dst, ignore_errors=True)
    print(json.dumps({"seconds": secs, "peak_rss": rss}))


def memory(baseline: str | None) -> None:
    here = str(Path(__file__).resolve().parents[1])
    trees = {"now": here} | ({"baseline": str(Path(baseline).resolve())} if baseline else {})
    for kind in dict.fromkeys(k for k, _, _ in MEMORY.values()):
        subprocess.run([sys.executable, __file__, "--memory-source", kind], check=True,
                       env=os.environ | {"PYTHONPATH": here})
    size = sum(f.stat().st_size for f in (MEMORY_ROOT / "bf16").glob("*.safetensors"))
    print(f"source {MEMORY_ROOT / 'bf16'}: {size / 2**30:.2f} GiB BF16, MLP weights 512 MiB each; {machine()}")
    print(f"{'conversion':<26}" + "".join(f"{t + ' peak RSS':>20}{'s':>7}" for t in trees))
    for label in MEMORY:
        row = f"{label:<26}"
        for tree in trees.values():
            out = subprocess.run([sys.executable, __file__, "--memory-child", label], capture_output=True, text=True,
                                 env=os.environ | {"PYTHONPATH": tree})
            if out.returncode != 0:
                raise SystemExit(f"{label} ({tree}) failed:\n{out.stderr[-3000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            row += f"{r['peak_rss'] / 2**20:>16.0f} MiB{r['seconds']:>7.1f}"
        print(row, flush=True)
    print("after: " + machine())


def calibration_source(label: str) -> tuple[Path, dict]:
    config = CALIBRATION[label]
    if isinstance(config, str):
        config = json.loads((Path(__file__).resolve().parents[1] / "pcc/models/configs" / f"{config}.json").read_text())
        config.pop("_source", None)
    return ROOT / ("cal-" + label.split(" (")[0].replace(" ", "-")), config


def generate(src: Path = SRC, config: dict = CONFIG) -> None:
    import torch
    from safetensors.torch import save_file

    from pcc.models.builtin import catalog_from_config

    if (src / "model.safetensors.index.json").is_file():
        return
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    ops = [op for op in catalog_from_config("bench", config).operators if op.family != "kv_cache"]
    gen = torch.Generator().manual_seed(0)
    weight_map, shard, size, k = {}, {}, 0, 1
    for i, op in enumerate(ops + [None]):
        if op is None or (size > 700e6 and shard):
            file = f"model-{k:05d}.safetensors"
            save_file(shard, str(src / file), metadata={"format": "pt"})
            weight_map.update({n: file for n in shard})
            shard, size, k = {}, 0, k + 1
        if op is not None:
            shard[op.tensor] = (torch.randn(op.shape, generator=gen) * 0.02).to(torch.bfloat16)
            size += shard[op.tensor].numel() * 2
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (src / "config.json").write_text(json.dumps(config))
    (ROOT / "bench.prec").write_text(CONTRACT)


def _fsync_tree(root: Path) -> None:
    for f in sorted(root.rglob("*")):
        if f.is_file():
            with f.open("rb") as h:
                os.fsync(h.fileno())
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def floor(dst: Path) -> None:
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    for f in sorted(SRC.glob("*.safetensors")):
        save_file(load_file(str(f)), str(dst / f.name))
    _fsync_tree(dst)


def straightforward(dst: Path) -> None:
    """One shard at a time, no overlap: read it, quantize each linear weight whole, write it."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from quantize import straightforward_fp8_block

    dst.mkdir()
    for f in sorted(SRC.glob("*.safetensors")):
        out = {}
        with safe_open(str(f), framework="pt") as h:
            for name in h.keys():
                t = h.get_tensor(name)
                if t.dim() == 2 and "embed" not in name and "lm_head" not in name:
                    out[name], out[name[:-7] + ".weight_scale_inv"] = straightforward_fp8_block(t)
                else:
                    out[name] = t
        save_file(out, str(dst / f.name))
    _fsync_tree(dst)


def pcc_convert(dst: Path) -> None:
    from pcc.convert.run import convert

    convert(str(ROOT / "bench.prec"), str(SRC), str(dst))


def llmcompressor(dst: Path) -> None:
    import logging

    from llmcompressor import model_free_ptq
    from loguru import logger

    logger.remove()  # its per-file log lines would drown the table
    logging.disable(logging.WARNING)
    model_free_ptq(str(SRC), str(dst), scheme="FP8_BLOCK", ignore=["lm_head"], device="cpu")
    _fsync_tree(dst)


METHODS = {"floor": floor, "straightforward": straightforward, "pcc": pcc_convert, "llm-compressor": llmcompressor}
LABELS = {"floor": "safetensors read+write", "straightforward": "straightforward fp8",
          "pcc": "pcc convert (fp8_block)", "llm-compressor": "llm-compressor model_free_ptq"}


def child(method: str) -> None:
    dst = ROOT / f"out-{method}"
    shutil.rmtree(dst, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    METHODS[method](dst)
    secs = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime  # every thread, user + kernel
    shutil.rmtree(dst, ignore_errors=True)
    print(json.dumps({"seconds": secs, "cpu": cpu, "peak_rss": after.ru_maxrss * 1024}))


def calibration_child(label: str, calibrate: bool) -> None:
    """One NVFP4 conversion of a generated source: whole seconds, the summary's calibration seconds."""
    from pcc.convert.run import convert

    src, config = calibration_source(label)
    moe = "num_experts" in config
    contract = src.parent / f"{src.name}.prec"
    contract.write_text(
        f'contract cal {{\n  model from "{src}"\n  hardware B200\n  rollout sglang {{\n    linear : nvfp4\n'
        f"    keep bf16 : embed, lm_head, norm{', router' if moe else ''}\n  }}\n"
        "  trainer megatron {\n    gemm : bf16\n    optimizer adam\n  }\n  trainable all\n"
        "  sync full_weights { schedule colocated bridge bf16 activation atomic }\n"
        + ("  routing replay rollout\n" if moe else "") + "}\n")
    dst = src.parent / f"out-{src.name}"
    shutil.rmtree(dst, ignore_errors=True)
    t0 = time.perf_counter()
    summary = convert(str(contract), str(src), str(dst), calibrate=calibrate)
    secs = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    shutil.rmtree(dst, ignore_errors=True)
    assert summary["calibrated_input_scales"] == (summary["input_scales"] if calibrate else 0), summary
    print(json.dumps({"seconds": secs, "calibration": summary["calibration_seconds"], "peak_rss": rss}))


def calibration() -> None:
    print(machine())
    print(f"{'source':<24}{'parameters':>11}{'calibration':>13}{'whole, with':>13}{'whole, without':>16}"
          f"{'peak RSS with':>15}{'without':>10}")
    for label in CALIBRATION:
        subprocess.run([sys.executable, __file__, "--generate-calibration", label], check=True)
        params = sum(f.stat().st_size for f in calibration_source(label)[0].glob("*.safetensors")) / 2
        r = {}
        for cal in (False, True):
            out = subprocess.run([sys.executable, __file__, "--calibration-child", label, str(int(cal))],
                                 capture_output=True, text=True, check=True)
            r[cal] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{label:<24}{params / 1e6:>10.1f}M{r[True]['calibration']:>12.2f}s{r[True]['seconds']:>12.1f}s"
              f"{r[False]['seconds']:>15.1f}s{r[True]['peak_rss'] / 2**30:>11.1f} GiB"
              f"{r[False]['peak_rss'] / 2**30:>6.1f} GiB", flush=True)
    print("after: " + machine())


def _has_llmcompressor(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import llmcompressor.entrypoints.model_free"], capture_output=True)
    return probe.returncode == 0


def compare(rounds: int, llmc_python: str) -> None:
    # Generated in a child too: a child's peak RSS starts at its parent's RSS when it was forked,
    # so this process must not grow (generating here would add ~1.4 GB to every method's figure).
    subprocess.run([sys.executable, __file__, "--generate"], check=True)
    size = sum(f.stat().st_size for f in SRC.glob("*.safetensors"))
    methods = {m: sys.executable for m in ("floor", "straightforward", "pcc")}
    if _has_llmcompressor(llmc_python):
        methods["llm-compressor"] = llmc_python
    else:
        print(f"llm-compressor: not importable by {llmc_python} (pip install -e .[bench]); left out")
    print(f"checkpoint {SRC}: {size / 1e9:.2f} GB BF16; {machine()}")
    print(f"best of {rounds} rounds, methods interleaved in alternating order, each in its own process")
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    names = list(methods)
    for r in range(rounds):
        for m in order(names, r):
            out = subprocess.run([methods[m], __file__, "--child", m], capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"{m} failed:\n{out.stderr[-3000:]}")
            runs[m].append(json.loads(out.stdout.strip().splitlines()[-1]))
    best = {m: {**min(rs, key=lambda r: r["seconds"]), "peak_rss": max(r["peak_rss"] for r in rs),
                "all": [round(r["seconds"], 2) for r in rs]} for m, rs in runs.items()}
    print(f"{'method':<31}{'GB/s of input':>14}{'seconds':>9}{'x floor':>9}{'CPU s':>7}{'peak RSS':>11}"
          "  every round (s); CPU: the best round's; RSS: the largest")
    for m in names:
        r = best[m]
        print(f"{LABELS[m]:<31}{size / r['seconds'] / 1e9:>14.2f}{r['seconds']:>9.2f}"
              f"{r['seconds'] / best['floor']['seconds']:>9.2f}{r['cpu']:>7.2f}{r['peak_rss'] / 2**20:>7.0f} MiB  {r['all']}")
    print("after: " + machine())


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return
    if sys.argv[1:] == ["--generate"]:
        generate()
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--generate-calibration":
        generate(*calibration_source(sys.argv[2]))
        return
    if len(sys.argv) == 4 and sys.argv[1] == "--calibration-child":
        calibration_child(sys.argv[2], sys.argv[3] == "1")
        return
    if sys.argv[1:] == ["--calibration"]:
        calibration()
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--memory-source":
        memory_source(sys.argv[2])
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--memory-child":
        memory_child(sys.argv[2])
        return
    if sys.argv[1:2] == ["--memory"]:
        if not (len(sys.argv) == 2 or len(sys.argv) == 4 and sys.argv[2] == "--baseline"):
            raise SystemExit("usage: python bench/convert.py --memory [--baseline DIR]")
        memory(sys.argv[3] if len(sys.argv) == 4 else None)
        return
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4, help="decoder layers of the generated checkpoint "
                    "(4: 2.01 GB; each layer 0.44 GB more)")
    add_busy(ap)
    ap.add_argument("--llmcompressor-python", default=sys.executable,
                    help="the python that runs llm-compressor (a separate environment, if it needs other packages)")
    args = ap.parse_args()
    if args.layers != LAYERS:  # the module-level paths follow the environment: run again with it set
        os.execve(sys.executable, [sys.executable, __file__, *sys.argv[1:]],
                  os.environ | {"PCC_BENCH_LAYERS": str(args.layers)})
    with busy(args.busy):
        compare(args.rounds, args.llmcompressor_python)


if __name__ == "__main__":
    main()
