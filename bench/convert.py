"""Block-FP8 conversion of a generated ~2 GB BF16 checkpoint: `pcc convert` beside the I/O floor and the
converters a user would pick instead, interleaved, on the machine as it is.

    python bench/convert.py [--rounds 3] [--busy [N]] [--large]   # generates the checkpoints once under $TMPDIR
    python bench/convert.py --threads [--rounds 3]  # where pcc's time goes: each thread's CPU, start-up, disk
    python bench/convert.py --compile [--rounds 3]  # where the first conversion by a contract compiles, by stage
    python bench/convert.py --calibration          # tiny_moe, dense 166M, MoE 494M, dense 886M (~3.1 GB under $TMPDIR)
    python bench/convert.py --memory [--baseline DIR]   # peak RSS with 512 MiB weights, per layout and source

Methods, each run in its own process (so its peak RSS is its own), all writing durably (every output
file fsynced before the clock stops):
- floor: safetensors `load_file` + `save_file` of every shard, unchanged (plain read + write);
- straightforward: one shard at a time, the whole-tensor block-FP8 quantizer of bench/quantize.py;
- pcc: `pcc convert CONTRACT --json` as a user runs it (pcc.cli.main, in the child: its parser, then the
  conversion) of the contract (fp8_block, embed and lm_head kept BF16) the first time (no converter plan
  kept in $PCC_CACHE, here the bench's own folder: compiled) and again (the plan the first kept), and of
  its bundle (`pcc compile`d untimed, for this source: its converter plan runs as it is, docs/convert.md
  "Start-up");
- llm-compressor: `model_free_ptq(scheme="FP8_BLOCK", ignore=["lm_head"])` on the CPU, when the python
  given by --llmcompressor-python (default: this one) can import it (`pip install -e .[bench]`); it
  does not fsync, so the bench fsyncs its files and counts that.
Each round runs every method once, in an order that alternates each round; each method keeps its
best round, with that round's CPU seconds (user + kernel time of all its threads: where neighbours
hold the cores, a method's time follows them), and the median over rounds of its round's time over the
physical floor's in the same round (paired: a floor's lucky round, 0.30 s where most take 0.5-0.6 here,
moves it less than the best-of ratio). Cores and load average are printed before and after.
`--busy` runs a CPU-bound process beside it all. pcc (and a --baseline tree) is byte-compiled before the
rounds, as an installed one is: with PYTHONDONTWRITEBYTECODE set and no __pycache__ in a checkout, every
child compiled pcc's sources (0.07 s).
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
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import add_busy, busy, machine, order

ROOT = Path(tempfile.gettempdir()) / "pcc-bench-convert"
# --large (handed to the children as PCC_BENCH_SIZE=large): the same shapes with more layers, 5+ GB each;
# --tiny (tests/test_bench_smoke.py): a few MB, the same code paths
SIZE = os.environ.get("PCC_BENCH_SIZE", "default")
LARGE, TINY = SIZE == "large", SIZE == "tiny"
if TINY:  # the smoke test's own folder: a bench someone runs meanwhile keeps its outputs
    ROOT = ROOT / "tiny"
LAYERS = 12 if LARGE else 2 if TINY else 4
CACHE = ROOT / "cache"  # the children's $PCC_CACHE: compiled kernels, and the converter plans the contract rows keep
SRC = ROOT / ("tiny-src" if TINY else "src" if LAYERS == 4 else f"src-{LAYERS}-layers")
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
          "intermediate_size": 14336, "num_hidden_layers": LAYERS, "num_attention_heads": 32, "num_key_value_heads": 8,
          "head_dim": 128, "vocab_size": 16384, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
          "torch_dtype": "bfloat16"}
if TINY:
    CONFIG |= {"hidden_size": 256, "intermediate_size": 640, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 64, "vocab_size": 1024}
CONTRACT = """contract bench-fp8 {
  model from "%s"
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
# A Qwen3-MoE with many small tensors, random weights written by transformers' save_pretrained: 16 layers of
# 32 experts [384, 1024] and q/k/v/o with biases, 1,747 tensors, 1.44 GB (--large: 60 layers, 6,543, 5.3 GB)
MOE_LAYERS = 60 if LARGE else 2 if TINY else 16
MOE_SRC = ROOT / ("tiny-moe" if TINY else "moe" if MOE_LAYERS == 16 else f"moe-{MOE_LAYERS}-layers")
MOE_CONFIG = {"hidden_size": 1024, "intermediate_size": 3072, "moe_intermediate_size": 384,
              "num_hidden_layers": MOE_LAYERS, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 128,
              "vocab_size": 32000, "num_experts": 32, "num_experts_per_tok": 4, "attention_bias": True,
              "tie_word_embeddings": False}
if TINY:
    MOE_CONFIG |= {"hidden_size": 256, "moe_intermediate_size": 192, "num_experts": 4, "vocab_size": 512}
MOE_CONTRACT = """contract bench-moe-fp8 {
  model from "%s"
  hardware H100
  rollout sglang {
    linear : fp8_block
    keep bf16 : embed, lm_head, norm, router
  }
  trainer megatron { gemm : bf16 optimizer adam }
  trainable all
  sync full_weights { schedule colocated bridge bf16 activation atomic }
  routing replay rollout
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

    ROOT.mkdir(parents=True, exist_ok=True)  # (a fresh machine: nothing under $TMPDIR yet)
    _write_if_changed(ROOT / "bench.prec", CONTRACT % src)
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


def _write_if_changed(path: Path, text: str) -> None:
    """A contract rewritten only when it changes: a converter plan kept for it stays good across runs."""
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def _moe_contract(src: Path) -> Path:
    return src.with_name(f"{src.name}.prec")


def generate_moe(src: Path = MOE_SRC) -> None:
    """The Qwen3-MoE source, written by transformers' save_pretrained (once: a marker beside it says it is whole)."""
    done = src.with_name(src.name + ".complete")
    src.parent.mkdir(parents=True, exist_ok=True)
    _write_if_changed(_moe_contract(src), MOE_CONTRACT % src)
    if done.is_file():
        return
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    shutil.rmtree(src, ignore_errors=True)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # initialized in BF16: no float32 copy of the model
    Qwen3MoeForCausalLM(Qwen3MoeConfig(**MOE_CONFIG)).save_pretrained(str(src))
    done.write_text("")


# checkpoint -> (label, source, contract, generator, tensors a straightforward converter keeps BF16)
CHECKPOINTS = {
    "llama": (f"LLaMA ({LAYERS} layers)", SRC, ROOT / "bench.prec", generate, ("embed", "lm_head")),
    "moe": (f"Qwen3-MoE ({MOE_LAYERS} layers, {MOE_CONFIG['num_experts']} experts)", MOE_SRC, _moe_contract(MOE_SRC),
            generate_moe,
            ("embed", "lm_head", "mlp.gate.")),
}


def _out_sizes(ckpt: str) -> Path:
    return ROOT / f"{CHECKPOINTS[ckpt][1].name}.out-sizes.json"


def physical(dst: Path, ckpt: str, stage: int, count: int) -> None:
    """The physical floor: every source byte read once (pread from the files the conversion reads) and the
    bytes of pcc's output shards written as pcc's writer writes them (pcc.convert.shards.ShardWriter): O_DIRECT
    from a ring of `count` page-aligned slots of `stage` bytes (pcc's STAGE_COUNT, STAGE_BYTES), each shard
    from a slot of its own, each slot written on a disk thread while the next is read into another, the last
    block zero-padded, each file truncated to its size, fsynced and renamed, then the directory fsynced. Nothing is computed or hashed: what is written is the source's
    first bytes."""
    import mmap
    from concurrent.futures import ThreadPoolExecutor

    align = 4096
    src = CHECKPOINTS[ckpt][1]
    shards = json.loads(_out_sizes(ckpt).read_text())
    fds = [os.open(f, os.O_RDONLY) for f in sorted(src.glob("*.safetensors"))]
    total_in = sum(os.fstat(fd).st_size for fd in fds)
    total_out = sum(size for _, size in shards)
    at = [0, 0, 0]  # source file, offset in it, bytes read in all

    def fill(view: memoryview) -> int:
        """Read the next source bytes into `view` (across files); how many were read."""
        n = 0
        while n < len(view) and at[0] < len(fds):
            got = os.preadv(fds[at[0]], [view[n:]], at[1])
            if got == 0:
                at[0], at[1] = at[0] + 1, 0
                continue
            n, at[1], at[2] = n + got, at[1] + got, at[2] + got
        return n

    def write_all(fd: int, buf, length: int) -> None:
        done = 0
        with memoryview(buf) as whole:
            while done < length:
                with whole[done:length] as view:
                    done += os.write(fd, view)

    bufs = [mmap.mmap(-1, stage) for _ in range(count)]
    spare = mmap.mmap(-1, stage)  # the source bytes beyond what is written, read in step with the writes
    pool = ThreadPoolExecutor(1)
    pending = [None] * count
    dst.mkdir()
    k, written = 0, 0
    for name, size in shards:
        tmp = dst / (name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0), 0o666)
        except OSError:  # a filesystem without O_DIRECT (tmpfs): written through the page cache, as pcc would
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        left = size
        while left:
            if pending[k] is not None:
                pending[k].result()
            n = min(stage, left)
            with memoryview(bufs[k]) as view:
                if fill(view[:n]) < n:
                    raise SystemExit(f"{src}: smaller than the output")
            pending[k] = pool.submit(write_all, fd, bufs[k], -(-n // align) * align)
            k, left, written = (k + 1) % count, left - n, written + n
            # the rest of the source read in step with the writes (what is still to be written kept for them)
            goal = min(written * total_in // total_out, total_in - (total_out - written))
            with memoryview(spare) as view:
                while at[2] < goal and fill(view[:min(stage, goal - at[2])]):
                    pass
        for p in pending:
            if p is not None:
                p.result()
        pending = [None] * count
        os.ftruncate(fd, size)
        os.fsync(fd)
        os.close(fd)
        os.replace(tmp, dst / name)
    with memoryview(spare) as view:
        while fill(view):
            pass
    pool.shutdown()
    for fd in fds:
        os.close(fd)
    fd = os.open(dst, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def floor(dst: Path, ckpt: str) -> None:
    """The copy floor: safetensors `load_file` + `save_file` of every source shard, unchanged."""
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    for f in sorted(CHECKPOINTS[ckpt][1].glob("*.safetensors")):
        save_file(load_file(str(f)), str(dst / f.name))
    _fsync_tree(dst)


def straightforward(dst: Path, ckpt: str) -> None:
    """One shard at a time, no overlap: read it, quantize each linear weight whole, write it."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from quantize import straightforward_fp8_block

    _, src, _, _, wide = CHECKPOINTS[ckpt]
    dst.mkdir()
    for f in sorted(src.glob("*.safetensors")):
        out = {}
        with safe_open(str(f), framework="pt") as h:
            for name in h.keys():
                t = h.get_tensor(name)
                if t.dim() == 2 and not any(w in name for w in wide):
                    out[name], out[name[:-7] + ".weight_scale_inv"] = straightforward_fp8_block(t)
                else:
                    out[name] = t
        save_file(out, str(dst / f.name))
    _fsync_tree(dst)


def _pcc_cli(source: Path, dst: Path, ckpt: str) -> dict:
    """`pcc convert SOURCE --source SRC -o DST --json` as a user runs it (pcc.cli.main: the CLI's parser, then
    the conversion), in this process; the envelope's result."""
    import contextlib
    import io

    from pcc.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["convert", str(source), "--source", str(CHECKPOINTS[ckpt][1]), "-o", str(dst), "--json"])
    if code != 0:
        raise SystemExit(f"pcc convert {source}: exit {code}\n{out.getvalue()[-3000:]}")
    return json.loads(out.getvalue())["result"]


def pcc_convert(dst: Path, ckpt: str) -> None:
    """`pcc convert CONTRACT` as the first time: its child emptied the kept converter plans before the clock."""
    if _pcc_cli(CHECKPOINTS[ckpt][2], dst, ckpt)["plan"] != "compiled":
        raise SystemExit(f"{CHECKPOINTS[ckpt][2]}: not compiled")


def pcc_again(dst: Path, ckpt: str) -> None:
    """`pcc convert CONTRACT` once more: the converter plan its last conversion compiled and kept."""
    if _pcc_cli(CHECKPOINTS[ckpt][2], dst, ckpt)["plan"] != "cached":
        raise SystemExit(f"{CHECKPOINTS[ckpt][2]}: its kept converter plan was not taken")


def pcc_bundle(dst: Path, ckpt: str) -> None:
    """`pcc convert BUNDLE` of the contract's bundle, compiled for this source: its converter plan as it is."""
    if _pcc_cli(_bundle(ckpt), dst, ckpt)["plan"] != "bundle":
        raise SystemExit(f"{_bundle(ckpt)}: not converted from its converter plan")


def llmcompressor(dst: Path, ckpt: str) -> None:
    import logging

    from llmcompressor import model_free_ptq
    from loguru import logger

    logger.remove()  # its per-file log lines would drown the table
    logging.disable(logging.WARNING)
    ignore = ["lm_head"] + (["re:.*mlp.gate$"] if ckpt == "moe" else [])
    model_free_ptq(str(CHECKPOINTS[ckpt][1]), str(dst), scheme="FP8_BLOCK", ignore=ignore, device="cpu")
    _fsync_tree(dst)


METHODS = {"physical": physical, "floor": floor, "straightforward": straightforward, "pcc": pcc_convert,
           "pcc-again": pcc_again, "pcc-bundle": pcc_bundle, "llm-compressor": llmcompressor}
LABELS = {"physical": "physical floor (read, write out)", "floor": "copy floor (safetensors)",
          "straightforward": "straightforward fp8", "pcc": "pcc convert CONTRACT (fp8_block)",
          "pcc-again": "  the same again (its plan kept)", "pcc-bundle": "  the same, BUNDLE (compiled for it)",
          "llm-compressor": "llm-compressor model_free_ptq"}


def _watch_threads() -> dict:
    """Hooks, installed before a conversion, that record where its time goes (`--threads`): each thread's CPU
    seconds when it ends (`threading.Thread.run`, which the pools' threads run too), the seconds the disk
    thread spent in its direct writes (`pcc.convert.shards._write_all`), and when the pipeline started. Those two
    modules are imported before the clock starts, to be hooked: their 0.01 s is missing from the start-up."""
    import re
    import threading

    from pcc.convert import fast, shards

    seen = {"cpu": {}, "disk": 0.0, "start": None, "t0": time.perf_counter()}
    lock = threading.Lock()
    run, write_all, pipeline = threading.Thread.run, shards._write_all, fast.pipeline

    def timed_run(self):
        try:
            run(self)
        finally:  # "Thread-2 (write_all)" -> write_all, "pcc-fast_1" -> pcc-fast
            group = re.sub(r"^Thread-\d+ \((.*)\)$", r"\1", re.sub(r"_\d+$", "", self.name))
            with lock:
                seen["cpu"][group] = seen["cpu"].get(group, 0.0) + time.thread_time()

    def timed_write(*args):
        t = time.perf_counter()
        try:
            return write_all(*args)
        finally:
            seen["disk"] += time.perf_counter() - t

    def started(*args, **kwargs):
        seen["start"] = time.perf_counter() - seen["t0"]
        return pipeline(*args, **kwargs)

    threading.Thread.run, shards._write_all, fast.pipeline = timed_run, timed_write, started
    return seen


def child(method: str, ckpt: str) -> None:
    dst = ROOT / f"out-{method}"
    for old in (dst, ROOT / f".{dst.name}.partial"):  # a killed earlier run's output or pcc's staging
        shutil.rmtree(old, ignore_errors=True)
    extra = {}
    if method == "pcc":  # the first conversion by this contract: nothing kept, in a cache of its own (the
        first = ROOT / "cache-first"  # again row takes the plans in CACHE; the torch and baseline rows are "pcc")
        shutil.rmtree(first, ignore_errors=True)
        first.mkdir()
        (CACHE / "kernels").mkdir(parents=True, exist_ok=True)
        (first / "kernels").symlink_to(CACHE / "kernels")  # (compiled kernels are no part of a first conversion)
        os.environ["PCC_CACHE"] = str(first)
    if method == "physical":  # how pcc stages its writes, read before the clock (importing pcc is not the floor's)
        from pcc.convert.shards import STAGE_BYTES, STAGE_COUNT

        extra = {"stage": STAGE_BYTES, "count": STAGE_COUNT}
    watched = _watch_threads() if os.environ.get("PCC_BENCH_THREADS") else None
    before = resource.getrusage(resource.RUSAGE_SELF)
    main_cpu, t0 = time.thread_time(), time.perf_counter()
    if watched is not None:
        watched["t0"] = t0
    METHODS[method](dst, ckpt, **extra)
    secs = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime  # every thread, user + kernel
    shutil.rmtree(dst, ignore_errors=True)
    got = {"seconds": secs, "cpu": cpu, "peak_rss": after.ru_maxrss * 1024}
    if watched is not None:
        got |= {"threads": {"main": time.thread_time() - main_cpu, **watched["cpu"]}, "disk": watched["disk"],
                "start": watched["start"]}
    print(json.dumps(got))


def sizes_child(ckpt: str) -> None:
    """An untimed pcc conversion (it also brings the source into the page cache): its output shards' sizes,
    which the physical floor writes, saved beside the source; and the contract's bundle (`pcc compile`), which
    the bundle row converts from."""
    from pcc.bundle.write import write_bundle
    from pcc.convert.run import convert
    from pcc.lower import compile_file

    _, src, contract, _, _ = CHECKPOINTS[ckpt]
    dst = ROOT / "out-sizes"
    shutil.rmtree(dst, ignore_errors=True)
    newest = max(p.stat().st_ctime for p in [contract, *src.iterdir()])  # (what a compile read just before is
    time.sleep(max(0.0, newest + 2.1 - time.time()))                      # not kept: the again row needs it)
    convert(str(contract), str(src), str(dst))
    shards = sorted((f.name, f.stat().st_size) for f in dst.glob("*.safetensors"))
    _out_sizes(ckpt).write_text(json.dumps(shards))
    shutil.rmtree(dst, ignore_errors=True)
    write_bundle(compile_file(str(contract)).plan, _bundle(ckpt), force=True, contract_path=str(contract))


def _bundle(ckpt: str) -> Path:
    return ROOT / f"{CHECKPOINTS[ckpt][1].name}.bundle"


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


def _tensor_count(path: Path) -> int:
    with path.open("rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return len(header) - ("__metadata__" in header)


def _path(tree: str) -> dict:
    """The environment of a child that imports pcc from `tree` (and what PYTHONPATH held already)."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH")) if p)}


def _has_fused(tree: str) -> bool:
    probe = subprocess.run([sys.executable, "-c", "from pcc import fused; raise SystemExit(not fused.available())"],
                           capture_output=True, env=os.environ | _path(tree))
    return probe.returncode == 0


def compare(rounds: int, llmc_python: str, only: list[str], skip: list[str], baseline: str | None) -> None:
    # Generated in a child too: a child's peak RSS starts at its parent's RSS when it was forked,
    # so this process must not grow (generating here would add ~1.4 GB to every method's figure).
    here = str(Path(__file__).resolve().parents[1])
    llmc = _has_llmcompressor(llmc_python)
    if not llmc:
        print(f"llm-compressor: not importable by {llmc_python} (pip install -e .[bench]): '-' in its row")
    fused = _has_fused(here)
    # row -> (label, method, python, environment)
    rows = {"physical": (LABELS["physical"], "physical", sys.executable, _path(here)),
            "floor": (LABELS["floor"], "floor", sys.executable, _path(here)),
            "straightforward": (LABELS["straightforward"], "straightforward", sys.executable, _path(here)),
            "pcc": (LABELS["pcc"] + ("" if fused else ", torch"), "pcc", sys.executable, _path(here))}
    if fused:  # (without the kernels no converter plan is used as it is: the torch path compiles the contract)
        rows["pcc-again"] = (LABELS["pcc-again"], "pcc-again", sys.executable, _path(here))
        rows["pcc-bundle"] = (LABELS["pcc-bundle"], "pcc-bundle", sys.executable, _path(here))
        rows["pcc-torch"] = ("  the same, PCC_FUSED=0 (torch)", "pcc", sys.executable,
                             _path(here) | {"PCC_FUSED": "0"})
    else:
        print("llvmlite: not importable (pip install -e .[fast]): pcc converts with torch")
    if baseline:
        rows["baseline"] = (f"  pcc of {Path(baseline).name}", "pcc", sys.executable,
                            _path(str(Path(baseline).resolve())))
    if llmc:
        rows["llm-compressor"] = (LABELS["llm-compressor"], "llm-compressor", llmc_python, {})
    rows = {k: v for k, v in rows.items() if k not in skip or k in ("physical", "floor")}
    for tree in [here] + ([baseline] if baseline else []):  # byte-compiled first, as an installed pcc is
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(tree) / "pcc")], check=True)
    print(machine())
    print(f"best of {rounds} rounds, methods interleaved in alternating order, each in its own process; "
          "x physical, x copy: seconds over each floor's; x phys, rounds: the median over rounds of a round's "
          "seconds over the physical floor's in that round (one lucky round of either moves it less); "
          "CPU s: user + system of every thread, the best round's; RSS: the largest")
    names = list(rows)
    for ckpt in only:
        label, src, _, _, _ = CHECKPOINTS[ckpt]
        subprocess.run([sys.executable, __file__, "--generate", ckpt], check=True)
        # (with the rows' pcc: the plan it keeps is the again row's, under a key over pcc's code)
        subprocess.run([sys.executable, __file__, "--sizes", ckpt], check=True, env=os.environ | _path(here))
        files = sorted(src.glob("*.safetensors"))
        size = sum(f.stat().st_size for f in files)
        tensors = sum(_tensor_count(f) for f in files)
        out = sum(s for _, s in json.loads(_out_sizes(ckpt).read_text()))
        runs: dict[str, list[dict]] = {m: [] for m in names}
        for r in range(rounds):
            for m in order(names, r):
                _, method, python, env = rows[m]
                got = subprocess.run([python, __file__, "--child", method, ckpt], capture_output=True, text=True,
                                     env=os.environ | env)
                if got.returncode != 0:
                    raise SystemExit(f"{m} ({ckpt}) failed:\n{got.stderr[-3000:]}")
                runs[m].append(json.loads(got.stdout.strip().splitlines()[-1]))
        best = {m: {**min(rs, key=lambda r: r["seconds"]), "peak_rss": max(r["peak_rss"] for r in rs),
                    "all": [round(r["seconds"], 2) for r in rs]} for m, rs in runs.items()}
        print(f"\n{label}: {size / 1e9:.2f} GB BF16 in {len(files)} file(s), {tensors:,} tensors; "
              f"pcc writes {out / 1e9:.2f} GB")
        print(f"{'method':<36}{'GB/s in':>8}{'seconds':>9}{'x physical':>11}{'x copy':>8}{'x phys, rounds':>15}"
              f"{'CPU s':>7}{'peak RSS':>11}  every round (s)")
        for m in names + ([] if llmc else ["llm-compressor"]):
            if m not in best:
                print(f"{LABELS[m]:<36}{'-':>8}{'-':>9}{'-':>11}{'-':>8}{'-':>15}{'-':>7}{'-':>11}")
                continue
            r = best[m]
            paired = statistics.median(a["seconds"] / b["seconds"] for a, b in zip(runs[m], runs["physical"]))
            print(f"{rows[m][0]:<36}{size / r['seconds'] / 1e9:>8.2f}{r['seconds']:>9.2f}"
                  f"{r['seconds'] / best['physical']['seconds']:>11.2f}{r['seconds'] / best['floor']['seconds']:>8.2f}"
                  f"{paired:>15.2f}{r['cpu']:>7.2f}{r['peak_rss'] / 2**20:>7.0f} MiB  {r['all']}", flush=True)
    print("after: " + machine())


def threads(rounds: int, only: list[str]) -> None:
    """`--threads`: where `pcc convert BUNDLE`'s time goes, each conversion in its own process (the bench's
    pcc-bundle child, hooked by `_watch_threads`): its seconds, the start-up before the pipeline, the seconds its
    disk thread spent writing, and the CPU seconds of each of its threads (a pool's summed)."""
    here = str(Path(__file__).resolve().parents[1])
    if not _has_fused(here):
        raise SystemExit("--threads: llvmlite is not importable, and the torch path has other threads")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(here) / "pcc")], check=True)
    print(machine())
    print("pcc convert BUNDLE, one conversion a row, each in its own process; start: seconds before the pipeline "
          "(imports, plan, kernels); disk: seconds in direct writes; CPU s of each thread at its end (main: the "
          "caller's; pcc-fast: the chunk workers together)")
    for ckpt in only:
        subprocess.run([sys.executable, __file__, "--generate", ckpt], check=True)
        subprocess.run([sys.executable, __file__, "--sizes", ckpt], check=True, env=os.environ | _path(here))
        got = []
        for _ in range(rounds):
            out = subprocess.run([sys.executable, __file__, "--child", "pcc-bundle", ckpt], capture_output=True,
                                 text=True, env=os.environ | _path(here) | {"PCC_BENCH_THREADS": "1"})
            if out.returncode != 0:
                raise SystemExit(f"pcc-bundle ({ckpt}) failed:\n{out.stderr[-3000:]}")
            got.append(json.loads(out.stdout.strip().splitlines()[-1]))
        groups = sorted({g for r in got for g in r["threads"]}, key=lambda g: (g != "main", g))
        print(f"\n{CHECKPOINTS[ckpt][0]}")
        print(f"{'seconds':>8}{'start':>7}{'disk':>7}{'CPU s':>7}" + "".join(f"{g:>11}" for g in groups))
        for r in got:
            print(f"{r['seconds']:>8.3f}{r['start']:>7.3f}{r['disk']:>7.3f}{r['cpu']:>7.2f}"
                  + "".join(f"{r['threads'].get(g, 0.0):>11.3f}" for g in groups), flush=True)
    print("after: " + machine())


def compile_child(ckpt: str) -> None:
    """The compile `pcc convert CONTRACT` runs the first time (pcc.convert.contract.load_plan, then the converter
    plan), stage by stage in this fresh process, as JSON: each stage's ms. The imports are timed in turn; the
    work by running load_plan itself with its stages wrapped (`_COMPILE_STAGES`), so the bench times what a
    conversion runs: a stage it no longer calls stops the bench."""
    stages, t = {}, time.perf_counter()

    def mark(stage: str) -> None:
        nonlocal t
        now = time.perf_counter()
        stages[stage], t = (now - t) * 1e3, now

    from pcc.convert.source import open_source

    src = open_source(CHECKPOINTS[ckpt][1])
    mark("open the source (headers; the kept plan's too)")
    import lark  # noqa: F401
    import pydantic  # noqa: F401
    import yaml  # noqa: F401

    mark("import pydantic, lark, PyYAML")
    import pcc.contract.model

    mark("import the contract's models")
    import importlib

    import pcc.convert.contract
    import pcc.lower.converter

    mark("import the compiler")
    timed: dict[str, float] = {}
    for module, name, stage in _COMPILE_STAGES:
        _time_calls(importlib.import_module(module), name, stage, timed)
    t0 = time.perf_counter()
    pcc.lower.converter.converter_plan(pcc.convert.contract.load_plan(str(CHECKPOINTS[ckpt][2]), source=src))
    whole = (time.perf_counter() - t0) * 1e3
    missing = [stage for _, _, stage in _COMPILE_STAGES if stage not in timed]
    if missing:
        raise SystemExit(f"load_plan no longer runs {', '.join(missing)}: update bench/convert.py _COMPILE_STAGES")
    for _, _, stage in _COMPILE_STAGES:
        stages[stage] = timed[stage]
    stages["the rest of load_plan"] = max(0.0, whole - sum(timed.values()))
    print(json.dumps(stages))


# (module, function, stage) of the compile's work, in the order load_plan and the conversion run them
_COMPILE_STAGES = [("pcc.convert.contract", "_catalog_of", "the catalog from the opened source's headers"),
                   ("pcc.plan", "load", "parse the contract"),
                   ("pcc.plan", "resolve", "resolve and check"),
                   ("pcc.plan", "run_checks", "resolve and check"),
                   ("pcc.lower", "lower_all", "lower every target the contract names"),
                   ("pcc.lower.converter", "converter_plan", "the converter plan")]


def _time_calls(module, name: str, stage: str, timed: dict) -> None:
    """`module.name` replaced by itself timed: each call's ms added to timed[stage]."""
    fn = getattr(module, name)

    def run(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            timed[stage] = timed.get(stage, 0.0) + (time.perf_counter() - t0) * 1e3

    setattr(module, name, run)


def compile_stages(rounds: int, only: list[str]) -> None:
    """`--compile`: where the first conversion by a contract spends what the kept plan does not, each round a
    fresh process (imports are paid once per process): each stage's best and median ms."""
    here = str(Path(__file__).resolve().parents[1])
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(here) / "pcc")], check=True)
    print(machine())
    for ckpt in only:
        subprocess.run([sys.executable, __file__, "--generate", ckpt], check=True)
        got = []
        for _ in range(rounds):
            out = subprocess.run([sys.executable, __file__, "--compile-child", ckpt], capture_output=True, text=True,
                                 env=os.environ | _path(here))
            if out.returncode != 0:
                raise SystemExit(f"--compile-child {ckpt} failed:\n{out.stderr[-3000:]}")
            got.append(json.loads(out.stdout.strip().splitlines()[-1]))
        tensors = sum(_tensor_count(f) for f in CHECKPOINTS[ckpt][1].glob("*.safetensors"))
        print(f"\n{CHECKPOINTS[ckpt][0]}, {tensors:,} tensors: the compile, ms "
              f"(best and median of {rounds} processes)")
        for stage in [*got[0], "total"]:
            values = [sum(r.values()) if stage == "total" else r[stage] for r in got]
            print(f"  {stage:<50}{min(values):>8.0f}{statistics.median(values):>8.0f}")
    print("after: " + machine())


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--generate":
        CHECKPOINTS[sys.argv[2]][3]()
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--sizes":
        sizes_child(sys.argv[2])
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--compile-child":
        compile_child(sys.argv[2])
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
    ap.add_argument("--large", action="store_true", help="5+ GB checkpoints: LLaMA with 12 layers (5.5 GB), "
                    "the Qwen3-MoE with 60 (5.3 GB)")
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # tests/test_bench_smoke.py
    ap.add_argument("--only", nargs="+", choices=list(CHECKPOINTS), default=list(CHECKPOINTS),
                    help="the checkpoints to convert (default: both)")
    ap.add_argument("--skip", nargs="+", default=[], choices=["straightforward", "pcc-torch", "llm-compressor"],
                    help="rows to leave out (straightforward fp8 takes 25-75 s a round and 6 GB on the MoE)")
    ap.add_argument("--baseline", metavar="DIR", help="also convert with the pcc of another checkout (e.g. a "
                    "`git archive` of main), interleaved with the rest")
    ap.add_argument("--threads", action="store_true", help="where pcc's time goes instead: --rounds conversions "
                    "of each bundle, the CPU seconds of each thread, the start-up and the disk's seconds")
    ap.add_argument("--compile", action="store_true", help="where the first conversion by a contract spends what "
                    "the kept plan does not: the compile's stages, --rounds fresh processes")
    add_busy(ap)
    ap.add_argument("--llmcompressor-python", default=sys.executable,
                    help="the python that runs llm-compressor (a separate environment, if it needs other packages)")
    args = ap.parse_args()
    size = "large" if args.large else "tiny" if args.tiny else "default"
    if size != SIZE:  # the module-level paths follow the environment: run again with it set
        os.execve(sys.executable, [sys.executable, __file__, *sys.argv[1:]], os.environ | {"PCC_BENCH_SIZE": size})
    os.environ["PCC_CACHE"] = str(CACHE)  # every child's: compiled kernels, the plans the again row takes
    with busy(args.busy):
        if args.threads:
            threads(args.rounds, args.only)
        elif args.compile:
            compile_stages(args.rounds, args.only)
        else:
            compare(args.rounds, args.llmcompressor_python, args.only, args.skip, args.baseline)


if __name__ == "__main__":
    main()
