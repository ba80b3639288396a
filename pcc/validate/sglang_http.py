"""A client for a real SGLang server (stdlib urllib only), behind the engine protocol.

Endpoints and fields, as in sgl-project/sglang (`managers/io_struct.py`, `entrypoints/http_server.py`):
- POST /generate {input_ids, sampling_params{max_new_tokens: 0, temperature}, return_logprob,
  logprob_start_len: 0, return_routed_experts, lora_path}: `meta_info.input_token_logprobs` is one
  [logprob, token_id, text] per input token (the first None); `meta_info.routed_experts` is base64
  int32 [tokens - 1, layers, top_k]; `meta_info.weight_version` the version that served it.
- POST /update_weights_from_disk {model_path, weight_version} -> {success, message}
- POST /load_lora_adapter {lora_name, lora_path}, /unload_lora_adapter {lora_name}
- POST /update_weight_version {new_version}; GET /get_model_info -> {weight_version, ...}
- POST /get_weights_by_name {name, truncate_size} -> the parameter's first rows as lists
A version is written to disk as a rollout checkpoint (or a PEFT adapter) plus pcc_manifest.json.
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import torch

from .engine import ActivationRefused, EngineError, Generated, Scores, Version

TIMEOUT = 120.0


class HttpEngine:
    def __init__(self, url: str, versions_dir: Path, plan, arch, timeout: float = TIMEOUT):
        self.url, self.dir, self.plan, self.arch, self.timeout = url.rstrip("/"), Path(versions_dir), plan, arch, timeout
        self.name = f"sglang {self.url}"
        self.installed: dict[int, tuple[Version, Path]] = {}
        self.manifests: dict[int, dict] = {}
        self.lora: str | None = None

    def _post(self, path: str, body: dict | None = None, method: str = "POST"):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")[:300]
            try:
                return {"success": False, "message": json.loads(text).get("message", text), "_status": exc.code}
            except ValueError:
                return {"success": False, "message": text, "_status": exc.code}
        except (urllib.error.URLError, OSError) as exc:
            raise EngineError(f"{self.url}{path}: {exc}") from None

    # -- scoring ------------------------------------------------------------------------------
    def _generate(self, ids: list[list[int]], sampling: dict, routes: bool) -> list[dict]:
        body = {"input_ids": ids, "sampling_params": sampling, "return_logprob": True, "logprob_start_len": 0,
                "return_routed_experts": routes}
        if self.lora is not None:
            body["lora_path"] = [self.lora] * len(ids)
        out = self._post("/generate", body)
        if isinstance(out, dict):
            raise EngineError(f"{self.url}/generate: {out.get('message', out)}")
        return out

    def score(self, tokens: torch.Tensor, prompt_len: int, routes: bool = False, cached_prefix: bool = False) -> Scores:
        if cached_prefix:  # build the radix cache from the prompts first; the full request then reuses it
            self._generate(tokens[:, :prompt_len].tolist(), {"max_new_tokens": 0, "temperature": 1.0}, False)
        else:
            self._post("/flush_cache")
        res = self._generate(tokens.tolist(), {"max_new_tokens": 0, "temperature": 1.0}, routes and self.arch.is_moe)
        logp = [[e[0] for e in r["meta_info"]["input_token_logprobs"][prompt_len:]] for r in res]
        got = None
        if routes and self.arch.is_moe and all("routed_experts" in r["meta_info"] for r in res):
            per = [_routes(r["meta_info"]["routed_experts"], self.arch) for r in res]  # [T-1, L, k] each
            got = [torch.stack([p[:, layer] for p in per]) for layer in range(self.arch.layers)]
        version = int(res[0]["meta_info"].get("weight_version") or -1)
        return Scores(torch.tensor(logp, dtype=torch.float64), got, version)

    def generate(self, prompts: torch.Tensor, new_tokens: int, seed: int, between=None) -> Generated:
        sampling = {"max_new_tokens": new_tokens, "temperature": 1.0, "sampling_seed": seed, "ignore_eos": True}
        worker = None
        if between is not None:  # an activation racing the batch, as a trainer's sync would
            worker = threading.Timer(0.01, between, args=(new_tokens // 2,))
            worker.start()
        res = self._generate(prompts.tolist(), sampling, False)
        if worker is not None:
            worker.join()
        out = [[e[1] for e in r["meta_info"]["output_token_logprobs"]] for r in res]
        lp = [[e[0] for e in r["meta_info"]["output_token_logprobs"]] for r in res]
        ver = [[int(r["meta_info"].get("weight_version") or -1)] * new_tokens for r in res]
        return Generated(torch.cat([prompts, torch.tensor(out)], 1), torch.tensor(lp, dtype=torch.float64),
                         torch.tensor(ver))

    # -- versions -----------------------------------------------------------------------------
    def install(self, version: Version) -> None:
        from safetensors.torch import save_file

        from pcc.lower.converter import converter_plan

        d = self.dir / f"v{version.version}-{len(self.installed)}"
        d.mkdir(parents=True, exist_ok=True)
        if version.moves == "adapter":
            tensors = {f"base_model.model.{k}": v.contiguous() for k, v in version.tensors.items()}
            save_file(tensors, str(d / "adapter_model.safetensors"))
            c = self.plan.contract.trainable
            mods = sorted({k.split(".lora_")[0].rsplit(".", 1)[-1] for k in version.tensors})
            (d / "adapter_config.json").write_text(json.dumps({
                "peft_type": "LORA", "r": c.rank, "lora_alpha": c.alpha or c.rank, "target_modules": mods,
                "lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM"}))
        else:
            save_file({k: v.contiguous() for k, v in version.tensors.items()}, str(d / "model.safetensors"))
            config = {k: v for k, v in self.plan.catalog.config.items() if not k.startswith("_")}
            qc = converter_plan(self.plan)["quantization_config"]
            if qc is not None:
                config["quantization_config"] = qc
            (d / "config.json").write_text(json.dumps(config, indent=1))
        (d / "pcc_manifest.json").write_text(json.dumps(version.manifest))
        self.installed[version.version] = (version, d)

    def activate(self, version: int) -> None:
        if version not in self.installed:
            raise EngineError(f"version {version} was never installed")
        v, d = self.installed[version]
        if v.moves == "adapter":
            name = f"pcc-v{version}-{d.name}"
            r = self._post("/load_lora_adapter", {"lora_name": name, "lora_path": str(d)})
            if not r or not r.get("success", False):
                raise ActivationRefused(f"load_lora_adapter {name}: {r.get('error_message') or r.get('message')}")
            self._post("/update_weight_version", {"new_version": str(version)})
            old, self.lora = self.lora, name
            if old is not None and old != name:
                self._post("/unload_lora_adapter", {"lora_name": old})
        else:
            r = self._post("/update_weights_from_disk", {"model_path": str(d), "weight_version": str(version)})
            if not r or not r.get("success", False):
                raise ActivationRefused(f"update_weights_from_disk {d}: {r.get('message')}")
        self.manifests[version] = v.manifest

    def active(self) -> tuple[int, dict]:
        info = self._post("/get_model_info", None, method="GET")
        v = int(info.get("weight_version") or -1)
        return v, self.manifests.get(v, {})

    def read_tensor(self, name: str) -> torch.Tensor:
        r = self._post("/get_weights_by_name", {"name": name, "truncate_size": 1 << 20})
        if r is None or (isinstance(r, dict) and not r.get("success", True)):
            raise EngineError(f"get_weights_by_name {name}: {r}")
        return torch.tensor(r, dtype=torch.float32)


def _routes(b64: str, arch) -> torch.Tensor:
    raw = torch.frombuffer(bytearray(base64.b64decode(b64)), dtype=torch.int32)
    return raw.reshape(-1, arch.layers, arch.topk).long()
