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
import threading

import torch

from .engine import ActivationRefused, EngineError, Generated, Scores
from .http_client import HttpClient, numbers


class HttpEngine(HttpClient):
    server = "SGLang"

    # -- scoring ------------------------------------------------------------------------------
    def _generate(self, ids: list[list[int]], sampling: dict, routes: bool) -> list[dict]:
        body = {"input_ids": ids, "sampling_params": sampling, "return_logprob": True, "logprob_start_len": 0,
                "return_routed_experts": routes}
        if self.lora is not None:
            body["lora_path"] = [self.lora] * len(ids)
        out = self._post("/generate", body)
        if isinstance(out, dict):
            raise EngineError(f"{self.url}/generate: {out.get('message', out)}")
        if not isinstance(out, list) or len(out) != len(ids):
            raise EngineError(f"{self.url}/generate: expected one result per sequence ({len(ids)}), got "
                              f"{str(out)[:80]}")
        return out

    def score(self, tokens: torch.Tensor, prompt_len: int, routes: bool = False, cached_prefix: bool = False) -> Scores:
        if cached_prefix:  # build the radix cache from the prompts first; the full request then reuses it
            self._generate(tokens[:, :prompt_len].tolist(), {"max_new_tokens": 0, "temperature": 1.0}, False)
        else:
            self._post("/flush_cache")
        res = self._generate(tokens.tolist(), {"max_new_tokens": 0, "temperature": 1.0}, routes and self.arch.is_moe)

        def parse() -> Scores:
            width = tokens.shape[1] - prompt_len
            logp = numbers([_column(r["meta_info"]["input_token_logprobs"][prompt_len:], 0) for r in res], width,
                           "input_token_logprobs")
            got = None
            if routes and self.arch.is_moe and all("routed_experts" in r["meta_info"] for r in res):
                per = [_routes(r["meta_info"]["routed_experts"], self.arch) for r in res]  # [T-1, L, k] each
                got = [torch.stack([p[:, layer] for p in per]) for layer in range(self.arch.layers)]
            version = int(res[0]["meta_info"].get("weight_version") or -1)
            return Scores(logp, got, version)

        return self._reply("/generate", parse)

    def generate(self, prompts: torch.Tensor, new_tokens: int, seed: int, between=None) -> Generated:
        sampling = {"max_new_tokens": new_tokens, "temperature": 1.0, "sampling_seed": seed, "ignore_eos": True}
        worker = None
        if between is not None:  # an activation racing the batch, as a trainer's sync would
            worker = threading.Timer(0.01, between, args=(new_tokens // 2,))
            worker.start()
        res = self._generate(prompts.tolist(), sampling, False)
        if worker is not None:
            worker.join()

        def parse() -> Generated:
            entries = [r["meta_info"]["output_token_logprobs"] for r in res]
            out = numbers([_column(e, 1) for e in entries], new_tokens, "output_token_logprobs' token ids", True)
            lp = numbers([_column(e, 0) for e in entries], new_tokens, "output_token_logprobs")
            ver = [[int(r["meta_info"].get("weight_version") or -1)] * new_tokens for r in res]
            return Generated(torch.cat([prompts, out], 1), lp, torch.tensor(ver))

        return self._reply("/generate", parse)

    # -- versions -----------------------------------------------------------------------------
    def activate(self, version: int) -> None:
        v, d = self._installed(version)
        if v.moves == "adapter":
            name = f"pcc-v{version}-{d.name}"
            r = self._post("/load_lora_adapter", {"lora_name": name, "lora_path": str(d)})
            if not isinstance(r, dict) or not r.get("success", False):
                r = r if isinstance(r, dict) else {"message": str(r)[:80]}
                raise ActivationRefused(f"load_lora_adapter {name}: {r.get('error_message') or r.get('message')}")
            self._post("/update_weight_version", {"new_version": str(version)})
            old, self.lora = self.lora, name
            if old is not None and old != name:
                self._post("/unload_lora_adapter", {"lora_name": old})
        else:
            r = self._post("/update_weights_from_disk", {"model_path": str(d), "weight_version": str(version)})
            if not isinstance(r, dict) or not r.get("success", False):
                r = r if isinstance(r, dict) else {"message": str(r)[:80]}
                raise ActivationRefused(f"update_weights_from_disk {d}: {r.get('message')}")
        self.manifests[version] = v.manifest

    def active(self) -> tuple[int, dict]:
        info = self._post("/get_model_info", None, method="GET")
        v = self._reply("/get_model_info", lambda: int(info.get("weight_version") or -1))
        return v, self.manifests.get(v, {})

    def read_tensor(self, name: str) -> torch.Tensor:
        r = self._post("/get_weights_by_name", {"name": name, "truncate_size": 1 << 20})
        if r is None or (isinstance(r, dict) and not r.get("success", True)):
            raise EngineError(f"get_weights_by_name {name}: {r}")
        return self._reply("/get_weights_by_name", lambda: torch.tensor(r, dtype=torch.float32))


def _column(entries, k: int):
    """Item `k` of each [logprob, token_id, text] entry; an entry of another shape is kept whole, for
    `numbers` to name."""
    if not isinstance(entries, list):
        return entries
    return [e[k] if isinstance(e, list) and len(e) > k else e for e in entries]


def _routes(b64: str, arch) -> torch.Tensor:
    raw = torch.frombuffer(bytearray(base64.b64decode(b64)), dtype=torch.int32)
    return raw.reshape(-1, arch.layers, arch.topk).long()
