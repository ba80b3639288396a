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
import time
import urllib.error
import urllib.request
from pathlib import Path

import torch

from .engine import ActivationRefused, EngineError, Generated, Scores, Version

TIMEOUT = 120.0  # the total deadline of one request: connect, headers and the whole body
SOCKET_TIMEOUT = 30.0  # connect, and each read of the socket
MAX_REPLY = 256 << 20  # get_weights_by_name of 1M values as JSON is ~20 MB; more is not an answer to us


class HttpEngine:
    def __init__(self, url: str, versions_dir: Path, plan, arch, timeout: float = TIMEOUT):
        self.url, self.dir, self.plan, self.arch, self.timeout = url.rstrip("/"), Path(versions_dir), plan, arch, timeout
        self.name = f"sglang {self.url}"
        self.installed: dict[int, tuple[Version, Path]] = {}
        self.manifests: dict[int, dict] = {}
        self.lora: str | None = None

    def _post(self, path: str, body: dict | None = None, method: str = "POST"):
        """One request with a total deadline (`timeout`: a server that sends a byte a second is cut off), a
        socket timeout, and a reply size cap; every failure an EngineError naming the endpoint. An HTTP
        error status is a reply {"success": False, "message", "_status"} for the caller to judge."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        where = f"{self.url}{path}"
        box: dict = {}
        deadline = time.monotonic() + self.timeout

        def fetch() -> None:
            try:
                box["reply"] = self._fetch(req, where, deadline)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
                box["error"] = exc

        worker = threading.Thread(target=fetch, name=f"pcc-http {path}", daemon=True)
        worker.start()
        worker.join(self.timeout + 1.0)
        if worker.is_alive():
            raise EngineError(f"{where}: no complete reply within {self.timeout:.0f} s")
        if "error" in box:
            raise box["error"]
        status, raw = box["reply"]
        if status is not None:  # an HTTP error status
            text = raw.decode(errors="replace")[:300]
            try:
                message = json.loads(text).get("message", text)
            except (ValueError, AttributeError):
                message = text
            return {"success": False, "message": f"HTTP {status}: {message}", "_status": status}
        try:
            return json.loads(raw or b"null")
        except ValueError as exc:
            raise EngineError(f"{where}: the reply is not JSON ({exc}): {raw[:80]!r}") from None

    def _fetch(self, req, where: str, deadline: float) -> tuple[int | None, bytes]:
        """(HTTP error status or None, body), read in pieces against the deadline and MAX_REPLY."""
        try:
            with urllib.request.urlopen(req, timeout=min(SOCKET_TIMEOUT, self.timeout)) as resp:
                return None, _body(resp, where, deadline)
        except urllib.error.HTTPError as exc:
            try:
                return exc.code, _body(exc, where, deadline)
            except EngineError:
                return exc.code, b""
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise EngineError(f"{where}: {reason}") from None

    def _reply(self, what: str, fn):
        """`fn()` over a reply; a reply of the wrong shape is an EngineError naming the endpoint, not a KeyError."""
        try:
            return fn()
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
            raise EngineError(f"{self.url}{what}: the reply is not what SGLang sends ({type(exc).__name__}: "
                              f"{exc})") from None

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
            logp = [[e[0] for e in r["meta_info"]["input_token_logprobs"][prompt_len:]] for r in res]
            got = None
            if routes and self.arch.is_moe and all("routed_experts" in r["meta_info"] for r in res):
                per = [_routes(r["meta_info"]["routed_experts"], self.arch) for r in res]  # [T-1, L, k] each
                got = [torch.stack([p[:, layer] for p in per]) for layer in range(self.arch.layers)]
            version = int(res[0]["meta_info"].get("weight_version") or -1)
            return Scores(torch.tensor(logp, dtype=torch.float64), got, version)

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
            out = [[e[1] for e in r["meta_info"]["output_token_logprobs"]] for r in res]
            lp = [[e[0] for e in r["meta_info"]["output_token_logprobs"]] for r in res]
            ver = [[int(r["meta_info"].get("weight_version") or -1)] * new_tokens for r in res]
            return Generated(torch.cat([prompts, torch.tensor(out)], 1), torch.tensor(lp, dtype=torch.float64),
                             torch.tensor(ver))

        return self._reply("/generate", parse)

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


def _body(resp, where: str, deadline: float) -> bytes:
    chunks, n = [], 0
    while True:
        if time.monotonic() > deadline:
            raise EngineError(f"{where}: the reply did not complete before the deadline")
        chunk = (getattr(resp, "read1", None) or resp.read)(1 << 16)
        if not chunk:
            return b"".join(chunks)
        n += len(chunk)
        if n > MAX_REPLY:
            raise EngineError(f"{where}: the reply is larger than {MAX_REPLY >> 20} MiB")
        chunks.append(chunk)


def _routes(b64: str, arch) -> torch.Tensor:
    raw = torch.frombuffer(bytearray(base64.b64decode(b64)), dtype=torch.int32)
    return raw.reshape(-1, arch.layers, arch.topk).long()
