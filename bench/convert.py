"""Block-FP8 conversion throughput of `pcc convert` on a ~2 GB BF16 checkpoint, beside the I/O
floor (plain safetensors read + write of the same shards) and a straightforward tensor-by-tensor
converter, all measured in this run. Each method runs in its own process so its peak RSS is its own.

    python bench/convert.py            # generates the checkpoint once under $TMPDIR, then reuses it
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


def generate() -> None:
    import torch
    from safetensors.torch import save_file

    from pcc.models.builtin import catalog_from_config

    if (SRC / "model.safetensors.index.json").is_file():
        return
    shutil.rmtree(SRC, ignore_errors=True)
    SRC.mkdir(parents=True)
    ops = [op for op in catalog_from_config("bench", CONFIG).operators if op.family != "kv_cache"]
    gen = torch.Generator().manual_seed(0)
    weight_map, shard, size, k = {}, {}, 0, 1
    for i, op in enumerate(ops + [None]):
        if op is None or (size > 700e6 and shard):
            file = f"model-{k:05d}.safetensors"
            save_file(shard, str(SRC / file), metadata={"format": "pt"})
            weight_map.update({n: file for n in shard})
            shard, size, k = {}, 0, k + 1
        if op is not None:
            shard[op.tensor] = (torch.randn(op.shape, generator=gen) * 0.02).to(torch.bfloat16)
            size += shard[op.tensor].numel() * 2
    (SRC / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (SRC / "config.json").write_text(json.dumps(CONFIG))
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


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return
    if sys.argv[1:] == ["--generate"]:
        generate()
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
