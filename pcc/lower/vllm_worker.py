"""pcc's vLLM worker extension: the bundle ships this file as rollout/pcc_vllm_worker.py, and the launcher
passes `--worker-extension-cls pcc_vllm_worker.PccWorkerExtension` with the folder on PYTHONPATH.

vLLM mixes the class into its Worker (v1/worker/worker_base.py, WorkerWrapperBase.init_worker; an attribute
the Worker already has is an assertion error, hence the `pcc_` prefix), and `/collective_rpc {method, args}`
runs a method on every worker (entrypoints/serve/dev/rpc/api_router.py: a dict reply is passed through as
JSON, anything else as str). It gives what vLLM 0.32 has no endpoint for:
- a served parameter's values by checkpoint name (q/k/v and gate/up sliced out of the packed qkv_proj and
  gate_up_proj, at the offsets the layer's weight_loader writes them), and a loaded adapter's tensors;
- a reload that checks the version's files against pcc_manifest.json first (dtype, shape, sha256 of the
  raw bytes, every tensor and nothing else) and loads exactly the bytes it checked; and the same check of
  an adapter's files, run before /v1/load_lora_adapter, in the process that then loads it.
A refusal is a reply {"refused": why}, not an exception, so the reason reaches the client.
Self-contained: it runs inside vLLM's worker, where pcc is not installed.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os

import torch

VERSION = 1
ADAPTER_PREFIX = "base_model.model."  # PEFT's prefix in adapter_model.safetensors; pcc's manifest omits it


def _encode(t: torch.Tensor) -> dict:
    t = t.detach().to("cpu").contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
            "data": base64.b64encode(raw).decode("ascii")}


def _sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def _checked(path: str, prefix: str = "") -> tuple[dict[str, torch.Tensor] | None, str]:
    """The tensors of every *.safetensors file under `path` (names without `prefix`), or None and why they do
    not match pcc_manifest.json there."""
    from safetensors.torch import load_file

    try:
        with open(os.path.join(path, "pcc_manifest.json"), encoding="utf-8") as f:
            man = json.load(f)
    except (OSError, ValueError) as exc:
        return None, f"{path}: no readable pcc_manifest.json ({type(exc).__name__}: {exc})"
    got: dict[str, torch.Tensor] = {}
    for fn in sorted(os.listdir(path)):
        if fn.endswith(".safetensors"):
            try:
                tensors = load_file(os.path.join(path, fn))
            except Exception as exc:  # safetensors' SafetensorError (a truncated header) is no OSError
                return None, f"{path}/{fn} does not load ({type(exc).__name__}: {exc})"
            got.update((k.removeprefix(prefix), t) for k, t in tensors.items())
    try:
        return _against(man, got, path)
    except (KeyError, TypeError, AttributeError) as exc:
        return None, f"{path}: a malformed pcc_manifest.json ({type(exc).__name__}: {exc})"


def _against(man: dict, got: dict[str, torch.Tensor], path: str) -> tuple[dict[str, torch.Tensor] | None, str]:
    want, v = man["tensors"], man.get("version")
    for k, meta in want.items():
        t = got.get(k)
        if t is None:
            return None, f"version {v}: tensor '{k}' is missing from {path}"
        if list(t.shape) != meta["shape"] or str(t.dtype).removeprefix("torch.") != meta["dtype"]:
            return None, (f"version {v}: tensor '{k}' is {str(t.dtype).removeprefix('torch.')} {list(t.shape)}, "
                          f"the manifest says {meta['dtype']} {meta['shape']}")
        if _sha256(t) != meta["sha256"]:
            return None, f"version {v}: tensor '{k}' fails its sha256 (damaged)"
    extra = sorted(set(got) - set(want))
    if extra:
        return None, f"version {v}: tensor '{extra[0]}' is not in the manifest"
    return got, ""


@contextlib.contextmanager
def _int8_scales_kept():
    """During a reload, each oneDNN W8A8 GEMM handle vLLM's CPU build creates keeps the weight-scale tensor it
    reads. The handle holds only a pointer to that tensor (csrc/cpu/dnnl_helper.cpp
    W8A8MatMulPrimitiveHandler::init_runtime_memory_cache wraps args.b_scales_ptr, read at every execute), and
    a reload builds the handle from freshly processed tensors, copies their values into the first load's and
    puts those back on the layer (model_executor/model_loader/reload/layerwise.py
    _copy_and_restore_kernel_tensors, _place_kernel_tensors): the fresh scale tensor is freed, the handle reads
    freed memory, and every log-prob after a reload is non-finite. The handle owning its tensor closes that."""
    try:
        from vllm import _custom_ops as ops
    except ImportError:
        ops = None
    make = getattr(ops, "create_onednn_scaled_mm", None)
    if make is None:
        yield
        return

    def keeping(weight, weight_scales, *args, **kwargs):
        handle = make(weight, weight_scales, *args, **kwargs)
        handle.pcc_weight_scales = weight_scales  # freed with the handle (CPUDNNLGEMMHandler.__del__)
        return handle

    ops.create_onednn_scaled_mm = keeping
    try:
        yield
    finally:
        ops.create_onednn_scaled_mm = make


def _through_kernel(module, rows: int = 1024) -> torch.Tensor | None:
    """A linear layer's weight [N, K] as its own kernel holds it: the kernel applied to the identity, I W^T.
    vLLM's CPU build moves an unquantized linear's weight into a oneDNN (or SGL) packed handle and leaves
    `weight` empty (model_executor/layers/utils.py dispatch_cpu_unquantized_gemm, remove_weight); its
    `cpu_linear` is the GEMM every forward calls. Each output element is one product w x 1 accumulated in
    FP32 and rounded back to the weight's dtype, so this is the weight exactly, as the GEMM reads it."""
    gemm = getattr(module, "cpu_linear", None)
    k = getattr(module, "input_size_per_partition", None)
    dtype = getattr(module, "params_dtype", None)
    if not callable(gemm) or not isinstance(k, int) or not isinstance(dtype, torch.dtype):
        return None
    with torch.inference_mode():
        return torch.cat([gemm(_eye_rows(i, rows, k, dtype), None, None) for i in range(0, k, rows)]).t().contiguous()


def _eye_rows(start: int, rows: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows start.. of the k x k identity, at most `rows` of them (never the whole identity: k can be 30k)."""
    n = min(rows, k - start)
    block = torch.zeros(n, k, dtype=dtype)
    block[torch.arange(n), torch.arange(start, start + n)] = 1
    return block


def _int8_through_kernel(module, rows: int = 1024) -> torch.Tensor | None:
    """A W8A8 INT8 linear's weight, dequantized (codes x per-channel scale, in FP32), as its kernel holds it.
    vLLM's CPU build keeps the int8 codes only in a oneDNN handle and sets `weight` to None
    (model_executor/kernels/linear/scaled_mm/cpu.py process_weights_for_onednn). The layer's own apply on the
    FP32 identity quantizes each row to one code 127 at scale 1/127 (per-token dynamic) and returns code x
    scale to within a few FP32 ulps; rounding that over the layer's weight_scale to the nearest integer gives
    the code exactly (|code| <= 127, error << 0.5)."""
    scale = getattr(module, "weight_scale", None)
    method = getattr(module, "quant_method", None)
    k = getattr(module, "input_size_per_partition", None)
    if not isinstance(scale, torch.Tensor) or method is None or not isinstance(k, int):
        return None
    s = scale.detach().float().reshape(-1, 1)
    with torch.inference_mode():
        out = torch.cat([method.apply(module, _eye_rows(i, rows, k, torch.float32))
                         for i in range(0, k, rows)]).t().float()
    if out.shape[0] != s.shape[0]:
        return None
    return torch.round(out / s).clamp(-128, 127) * s


def _int8_unpacked(module, packed: torch.Tensor, pack=None, block: int = 32) -> torch.Tensor | None:
    """A W8A8 INT8 linear's weight, dequantized (codes x per-channel scale, in FP32), from the packed codes its
    kernel reads. On a CPU with AMX, vLLM's CPU build runs the SGL int8 GEMM instead of oneDNN and keeps
    `weight` as torch.ops._C.convert_weight_packed made it (model_executor/kernels/linear/scaled_mm/cpu.py
    process_weights_for_sgl, when layers/utils.py check_cpu_sgl_kernel holds): [N, K + 4], each block of 32
    output channels the codes as [K/4, 32, 4] then 32 int32 compensations (csrc/cpu/sgl-kernels/gemm.cpp
    pack_vnni<int8_t>). That kernel takes only BF16 input, whose output rounds a code by up to 0.47 on the
    identity, so the layout is undone instead; packing the codes again must give the very bytes the kernel
    holds, else None (a layout this does not know). `pack`: vLLM's op unless given."""
    k = getattr(module, "input_size_per_partition", None)
    scale = getattr(module, "weight_scale", None)
    if pack is None:
        try:
            pack = torch.ops._C.convert_weight_packed
        except (AttributeError, RuntimeError):
            return None
    if not isinstance(k, int) or not isinstance(scale, torch.Tensor) or packed.dim() != 2 or k % 4:
        return None
    n = packed.shape[0]
    if packed.shape[1] != k + 4 or n % block or scale.numel() != n:
        return None
    blocks = packed.detach().reshape(n // block, block * (k + 4))[:, :block * k]
    codes = blocks.reshape(n // block, k // 4, block, 4).permute(0, 2, 1, 3).reshape(n, k).contiguous()
    with torch.inference_mode():
        if not torch.equal(pack(codes), packed):
            return None
    return codes.float() * scale.detach().float().reshape(n, 1)


def _module(model, module_name: str) -> tuple[str, tuple[str, int] | None]:
    """The vLLM module holding checkpoint module `module_name`, and (packed name, index) where the model packs
    it (its packed_modules_mapping: q/k/v -> qkv_proj, gate/up -> gate_up_proj), else None."""
    try:
        model.get_submodule(module_name)
        return module_name, None
    except AttributeError:
        pass
    parent, _, leaf = module_name.rpartition(".")
    for packed, parts in getattr(model, "packed_modules_mapping", {}).items():
        if leaf in parts:
            return f"{parent}.{packed}" if parent else packed, (packed, parts.index(leaf))
    return module_name, None


class PccWorkerExtension:
    """Methods `/collective_rpc` calls on each vLLM worker (self is the Worker)."""

    def pcc_extension(self) -> dict:
        """The probe the client sends: this module is loaded, and which protocol it speaks."""
        return {"pcc_worker_extension": VERSION}

    def pcc_reload_weights(self, weights_path: str) -> dict:
        """vLLM's in-place reload (Worker.reload_weights), of exactly the tensors checked against the manifest."""
        tensors, why = _checked(weights_path)
        if tensors is None:
            return {"refused": why}
        with _int8_scales_kept():
            self.reload_weights(weights_iterator=iter(tensors.items()))
        return {"loaded": len(tensors)}

    def pcc_check_adapter(self, lora_path: str) -> dict:
        """The adapter's files against its manifest, before /v1/load_lora_adapter loads them in this process."""
        tensors, why = _checked(lora_path, ADAPTER_PREFIX)
        return {"refused": why} if tensors is None else {"checked": len(tensors)}

    def pcc_read_parameter(self, name: str) -> dict:
        """The served values of checkpoint tensor `name` (e.g. model.layers.0.self_attn.q_proj.weight)."""
        model = self.model_runner.get_model()
        module_name, _, param = name.rpartition(".")
        target, where = _module(model, module_name)
        try:
            module = model.get_submodule(target)
        except AttributeError:
            return {"missing": f"the model has no module {target}"}
        module = getattr(module, "base_layer", module)  # a LoRA wrapper's own layer
        values = getattr(module, param, None)
        if param == "weight" and (values is None or values.numel() == 0):
            # the CPU build keeps it only inside its GEMM's packed handle
            values = _int8_through_kernel(module) if values is None else _through_kernel(module)
        elif param == "weight" and values.dtype == torch.int8 and hasattr(module, "weight_scale"):
            values = _int8_unpacked(module, values)  # the SGL kernel's packed codes (an AMX CPU)
            if values is None:
                return {"missing": f"{target} holds its int8 {param} in a packing pcc does not know"}
        if not isinstance(values, torch.Tensor):
            return {"missing": f"{target} has no tensor {param}"}
        if where is None:
            return _encode(values)
        sizes = getattr(module, "output_partition_sizes", None)
        if sizes is None or where[1] >= len(sizes):
            return {"missing": f"{target} does not say where its part {where[1]} lies (output_partition_sizes)"}
        start = sum(sizes[:where[1]])
        return _encode(values.narrow(0, start, sizes[where[1]]))

    def pcc_read_adapter(self, name: str) -> dict:
        """PEFT tensor `name` (model.layers.0.self_attn.q_proj.lora_B.weight) of the newest loaded adapter: vLLM's
        API server numbers adapters in load order (entrypoints/openai/models/serving.py, lora_id_counter). Its
        lora_B carries the adapter's scaling, which vLLM folds in at load (lora/lora_weights.py, optimize)."""
        manager = getattr(self.model_runner, "lora_manager", None)
        loaded = manager._adapter_manager.list_adapters() if manager is not None else {}
        if not loaded:
            return {"missing": "no adapter is loaded"}
        lora_id = max(loaded)
        adapter = loaded[lora_id]
        module_name, _, kind = name.removesuffix(".weight").rpartition(".")
        target, where = _module(self.model_runner.get_model(), module_name)
        weights = adapter.get_lora(target)
        if weights is None or kind not in ("lora_A", "lora_B"):
            return {"missing": f"adapter {lora_id} has no {name}"}
        t = weights.lora_a if kind == "lora_A" else weights.lora_b
        if where is not None:
            t = t[where[1]] if isinstance(t, list) else None
        if t is None:
            return {"missing": f"adapter {lora_id} has no {name}"}
        return {**_encode(t), "adapter_id": lora_id}
