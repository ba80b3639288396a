"""Block-FP8 conversion throughput of `pcc convert` on a ~2 GB BF16 checkpoint, beside the I/O
floor (plain safetensors read + write of the same shards) and a straightforward tensor-by-tensor
converter, all measured in this run. Each method runs in its own process so its peak RSS is its own.
`--calibration`: the cost of NVFP4 input-scale calibration (docs/convert.md "Input scales"), each
generated source converted to NVFP4 without and with `calibrate`, each conversion in its own process.

    python bench/convert.py                  # generates the checkpoint once under $TMPDIR, then reuses it
    python bench/convert.py --calibration    # tiny_moe, dense 166M, MoE 494M, dense 886M (~3.1 GB under $TMPDIR)
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

ROOT = Path(tempfile.gettempdir()) / "pcc-bench-convert"
SRC = ROOT / "src"
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
          "intermediate_size": 14336, "num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 8,
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


def floor(dst: Path) -> None:
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    for f in sorted(SRC.glob("*.safetensors")):
        save_file(load_file(str(f)), str(dst / f.name))


def straightforward(dst: Path) -> None:
    """One tensor at a time, no overlap: read, quantize (pcc.numerics), collect, write per shard."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from pcc.numerics import quantize

    dst.mkdir()
    for f in sorted(SRC.glob("*.safetensors")):
        out = {}
        with safe_open(str(f), framework="pt") as h:
            for name in h.keys():
                t = h.get_tensor(name)
                if t.dim() == 2 and "embed" not in name and "lm_head" not in name:
                    q = quantize(t, "fp8_block", name=name)
                    out[name], out[name[:-7] + ".weight_scale_inv"] = q.codes, q.scales
                else:
                    out[name] = t
        save_file(out, str(dst / f.name))


def pcc_convert(dst: Path) -> None:
    from pcc.convert.run import convert

    convert(str(ROOT / "bench.prec"), str(SRC), str(dst))


def child(method: str) -> None:
    dst = ROOT / f"out-{method}"
    shutil.rmtree(dst, ignore_errors=True)
    t0 = time.perf_counter()
    {"floor": floor, "straightforward": straightforward, "pcc": pcc_convert}[method](dst)
    secs = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    shutil.rmtree(dst, ignore_errors=True)
    print(json.dumps({"seconds": secs, "peak_rss": rss}))


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
    print(f"{os.cpu_count()} cores, load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())
          + time.strftime(", %Y-%m-%d %H:%M %Z"))
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
    print("load average after: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


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
    # Generated in a child too: a child's peak RSS starts at its parent's RSS when it was forked,
    # so this process must not grow (generating here would add ~1.4 GB to every method's figure).
    subprocess.run([sys.executable, __file__, "--generate"], check=True)
    size = sum(f.stat().st_size for f in SRC.glob("*.safetensors"))
    print(f"checkpoint {SRC}: {size / 1e9:.2f} GB BF16; {os.cpu_count()} cores, load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()) + time.strftime(", %Y-%m-%d %H:%M %Z"))
    print(f"{'method':<28}{'GB/s of input':>14}{'seconds':>10}{'peak RSS':>12}")
    for method, label in (("floor", "safetensors read+write"), ("straightforward", "straightforward fp8"),
                          ("pcc", "pcc convert (fp8_block)")):
        out = subprocess.run([sys.executable, __file__, "--child", method], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{label:<28}{size / r['seconds'] / 1e9:>14.2f}{r['seconds']:>10.2f}{r['peak_rss'] / 2**20:>9.0f} MiB")
    print("load average after: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
