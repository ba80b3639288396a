"""A client for a real `vllm serve` (vLLM 0.32's OpenAI-compatible server), behind the engine protocol.

Endpoints and fields, as in vllm-project/vllm v0.32.0 (paths under vllm/entrypoints/):
- POST /v1/completions (openai/completion/protocol.py `CompletionRequest`, serving.py), token ids as
  `prompt` (a list of lists: one prompt each). Scoring {max_tokens: 0, echo: true, prompt_logprobs: 0,
  return_token_ids: true}: `choices[i].prompt_logprobs` is one {token_id: {logprob, rank,
  decoded_token}} per prompt token (the first null), `prompt_token_ids` what was scored,
  `routed_experts` base64 `.npy` [tokens - 1, layers, top_k] (--enable-return-routed-experts).
  A request with prompt_logprobs never reads the prefix cache (vllm/sampling_params.py,
  skip_reading_prefix_cache), so scoring through request state is a warm-up request with the whole
  sequences, then one prompt per position {max_tokens: 1, logprobs: 0, logprob_token_ids,
  return_tokens_as_token_ids}: `choices[i].logprobs.top_logprobs[0]["token_id:N"]`.
  Generation {max_tokens, seed, ignore_eos, logprobs: 0, return_token_ids, and every sampling field at
  its neutral value, else the model's generation_config defaults apply}: `choices[i].token_ids`,
  `choices[i].logprobs.token_logprobs`.
- GET /v1/models (openai/models/): the base model is the card without a `parent`; an adapter is
  named in `model`.
- POST /v1/load_lora_adapter {lora_name, lora_path}, /v1/unload_lora_adapter {lora_name} (serve/lora/,
  with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True): plain text on success, an ErrorResponse otherwise.
- With VLLM_SERVER_DEV_MODE=1 (launchers/api_server/routers.py): POST /collective_rpc {method:
  "reload_weights", kwargs: {weights_path}} (serve/dev/rpc/; v1/worker/gpu_worker.py reload_weights,
  model_executor/model_loader/reload/inplace.py), POST /reset_prefix_cache (serve/dev/cache/),
  POST /pause?mode=wait, /resume, /update_weight_version {new_version}, GET /weight_info ->
  {weight_version} ("default" until one is set) (rl/online/api_router.py).
- pcc's worker extension (pcc/lower/vllm_worker.py; the bundle's launcher passes --worker-extension-cls), found
  by the probe rpc `pcc_extension`: `/collective_rpc {method: pcc_read_parameter | pcc_read_adapter, args:
  [name]}` -> {"results": [{dtype, shape, data: base64 of the raw bytes}]}, `pcc_reload_weights` (the full-weights
  sync: the manifest checked in the worker, then reload_weights of the checked tensors) and `pcc_check_adapter`
  (before /v1/load_lora_adapter); {"refused": why} is a refusal.
Not over HTTP: without the extension a parameter's values (read_tensor raises NotServed); ever, the version that
served a completion (the response names none: `score` reads /weight_info before and after and refuses a change).
"""

from __future__ import annotations

import base64
import io
import threading

import torch

from .engine import ActivationRefused, EngineError, Generated, NotServed, Scores
from .http_client import HttpClient, numbers

SCORE = {"max_tokens": 0, "echo": True, "prompt_logprobs": 0, "return_token_ids": True}
# CompletionRequest._DEFAULT_SAMPLING_PARAMS with their neutral values: temperature 1, nothing filtered
SAMPLE = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
          "presence_penalty": 0.0, "frequency_penalty": 0.0}
MAX_PROMPTS = 1024  # envs.VLLM_MAX_COMPLETION_PROMPTS's default: prompts one request may carry
# the endpoints vLLM registers only under an environment variable (a 404 otherwise)
NEEDS = {"/weight_info": "VLLM_SERVER_DEV_MODE=1", "/collective_rpc": "VLLM_SERVER_DEV_MODE=1",
         "/reset_prefix_cache": "VLLM_SERVER_DEV_MODE=1", "/pause": "VLLM_SERVER_DEV_MODE=1",
         "/resume": "VLLM_SERVER_DEV_MODE=1", "/update_weight_version": "VLLM_SERVER_DEV_MODE=1",
         "/v1/load_lora_adapter": "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True",
         "/v1/unload_lora_adapter": "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"}


class VllmEngine(HttpClient):
    server = "vLLM"

    def __init__(self, url: str, versions_dir, plan, arch, **kw):
        super().__init__(url, versions_dir, plan, arch, **kw)
        self.base: str | None = None
        self.extension: bool | None = None  # pcc's worker extension answers /collective_rpc (probed once)

    def _ok(self, path: str, reply):
        """The reply, or an EngineError naming the endpoint when it is an HTTP error status."""
        if isinstance(reply, dict) and "_status" in reply:
            need = NEEDS.get(path.split("?")[0]) if _no_route(reply) else None
            hint = f" (vLLM serves it only when started with {need})" if need else ""
            raise EngineError(f"{self.url}{path}: {reply['message']}{hint}")
        return reply

    def _model(self) -> str:
        """The `model` of each request: the active adapter, else the served base model."""
        if self.lora is not None:
            return self.lora
        if self.base is None:
            r = self._ok("/v1/models", self._post("/v1/models", method="GET"))
            self.base = self._reply("/v1/models", lambda: [m["id"] for m in r["data"] if m.get("parent") is None][0])
        return self.base

    def _complete(self, prompts: list[list[int]], fields: dict) -> list[dict]:
        """The choices for `prompts`, in order, at most MAX_PROMPTS per request."""
        out: list[dict] = []
        for i in range(0, len(prompts), MAX_PROMPTS):
            part = prompts[i:i + MAX_PROMPTS]
            r = self._ok("/v1/completions", self._post("/v1/completions",
                                                       {"model": self._model(), "prompt": part, **fields}))
            choices = self._reply("/v1/completions", lambda: sorted(r["choices"], key=lambda c: c["index"]))
            if len(choices) != len(part):
                raise EngineError(f"{self.url}/v1/completions: expected one choice per prompt ({len(part)}), got "
                                  f"{len(choices)}")
            out += choices
        return out

    def _version(self) -> int:
        info = self._ok("/weight_info", self._post("/weight_info", method="GET"))
        return self._reply("/weight_info", lambda: -1 if info["weight_version"] == "default"
                           else int(info["weight_version"]))

    # -- scoring ------------------------------------------------------------------------------
    def score(self, tokens: torch.Tensor, prompt_len: int, routes: bool = False, cached_prefix: bool = False) -> Scores:
        ids = tokens.tolist()
        before = self._version()
        if cached_prefix:
            logp, got = self._decode(ids, prompt_len), None
        else:
            res = self._complete(ids, SCORE)
            logp, got = self._reply("/v1/completions", lambda: self._prompt_logp(ids, prompt_len, res, routes))
        after = self._version()
        if after != before:
            raise EngineError(f"{self.url}: the weight version moved from {before} to {after} while scoring, and "
                              "vLLM's completions do not say which one served them")
        return Scores(logp, got, before)

    def _prompt_logp(self, ids, prompt_len: int, res: list[dict], routes: bool):
        logp = []
        for i, (row, c) in enumerate(zip(ids, res)):
            if c["prompt_token_ids"] != row:
                raise ValueError(f"prompt_token_ids {c['prompt_token_ids']!r:.60} are not the tokens sent")
            pl = c["prompt_logprobs"]
            if not isinstance(pl, list) or len(pl) != len(row):
                got = f"{len(pl)} entries" if isinstance(pl, list) else type(pl).__name__
                raise ValueError(f"prompt_logprobs of sequence {i}: {got} where {len(row)} go (one per prompt token)")
            logp.append([pl[j][str(row[j])]["logprob"] for j in range(prompt_len, len(row))])
        got = None
        if routes and self.arch.is_moe and all(c.get("routed_experts") for c in res):
            per = [_npy(c["routed_experts"], len(row) - 1, self.arch) for row, c in zip(ids, res)]
            got = [torch.stack([p[:, layer] for p in per]) for layer in range(self.arch.layers)]
        return numbers(logp, len(ids[0]) - prompt_len, "prompt_logprobs"), got

    def _decode(self, ids: list[list[int]], prompt_len: int) -> torch.Tensor:
        """Each response token scored by a request for its prefix alone, after a warm-up request with the
        whole sequences filled the prefix cache: cached KV plus the uncached tail, as decoding reads it."""
        self._complete(ids, {"max_tokens": 1, **SAMPLE})
        targets = sorted({t for row in ids for t in row[prompt_len:]})
        prefixes = [row[:t] for row in ids for t in range(prompt_len, len(row))]
        res = self._complete(prefixes, {"max_tokens": 1, **SAMPLE, "logprobs": 0, "logprob_token_ids": targets,
                                        "return_tokens_as_token_ids": True})

        def parse() -> torch.Tensor:
            steps = iter(c["logprobs"]["top_logprobs"][0] for c in res)
            return numbers([[next(steps)[f"token_id:{row[t]}"] for t in range(prompt_len, len(row))] for row in ids],
                           len(ids[0]) - prompt_len, "top_logprobs")

        return self._reply("/v1/completions", parse)

    def generate(self, prompts: torch.Tensor, new_tokens: int, seed: int, between=None) -> Generated:
        """The k-th copy of each prompt goes in request k with seed k: vLLM seeds every prompt of a request
        alike, so copies in one request would sample one continuation. An activation meanwhile lands between
        requests (/pause waits for the one in flight). vLLM's completions report no weight version per token."""
        rows = prompts.tolist()
        copy = [sum(r == rows[j] for j in range(i)) for i, r in enumerate(rows)]
        fields = {"max_tokens": new_tokens, **SAMPLE, "ignore_eos": True, "logprobs": 0, "return_token_ids": True,
                  "return_tokens_as_token_ids": True}
        worker = None
        if between is not None:  # an activation racing the batch, as a trainer's sync would
            worker = threading.Timer(0.01, between, args=(new_tokens // 2,))
            worker.start()
        res: list[dict] = [{}] * len(rows)
        for k in range(max(copy) + 1):
            idx = [i for i, c in enumerate(copy) if c == k]
            for i, choice in zip(idx, self._complete([rows[i] for i in idx], {**fields, "seed": seed * 1009 + k})):
                res[i] = choice
        if worker is not None:
            worker.join()

        def parse() -> Generated:
            out = numbers([c["token_ids"] for c in res], new_tokens, "token_ids", True)
            lp = numbers([c["logprobs"]["token_logprobs"] for c in res], new_tokens, "token_logprobs")
            return Generated(torch.cat([prompts, out], 1), lp, None)

        return self._reply("/v1/completions", parse)

    # -- pcc's worker extension --------------------------------------------------------------------
    def _has_extension(self) -> bool:
        """Does the server run pcc's worker extension? vLLM answers an rpc of a method no worker has with an
        HTTP error (run_method's NotImplementedError), and a server without VLLM_SERVER_DEV_MODE with a 404."""
        if self.extension is None:
            r = self._post("/collective_rpc", {"method": "pcc_extension"})
            self.extension = not (isinstance(r, dict) and "_status" in r) and self._reply(
                "/collective_rpc", lambda: r["results"][0]["pcc_worker_extension"] == 1)
        return self.extension

    def _rpc(self, method: str, arg: str) -> dict:
        """The one worker's reply to extension method `method` (a tensor-parallel server has several)."""
        r = self._ok("/collective_rpc", self._post("/collective_rpc", {"method": method, "args": [arg]}))
        results = self._reply("/collective_rpc", lambda: list(r["results"]))
        if len(results) != 1:
            raise NotServed(f"{self.url}: {len(results)} workers answered {method}; pcc reads one unsharded worker")
        if not isinstance(results[0], dict):
            raise EngineError(f"{self.url}/collective_rpc {method}: the reply is not what pcc's worker extension "
                              f"sends ({results[0]!r:.80})")
        return results[0]

    # -- versions -----------------------------------------------------------------------------
    def activate(self, version: int) -> None:
        v, d = self._installed(version)
        if v.moves == "adapter":
            # one name per install directory (HttpClient.install never reuses one): vLLM refuses to load a
            # name it holds (HTTP 400 "has already been loaded ... set 'load_inplace' to True",
            # openai/models/serving.py _check_load_lora_adapter_request), and an in-place reload from the same
            # path keeps prefix-cache blocks of the old weights (serving.py load_lora_adapter)
            name = f"pcc-v{version}-{d.name}"
            if name != self.lora:  # the active adapter again: nothing to load
                if self._has_extension():  # the manifest checked where vLLM loads the files
                    why = self._rpc("pcc_check_adapter", str(d)).get("refused")
                    if why:
                        raise ActivationRefused(f"pcc_check_adapter {d}: {why}")
                r = self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(d)}, text=True)
                if isinstance(r, dict):
                    if _no_route(r):
                        self._ok("/v1/load_lora_adapter", r)
                    raise ActivationRefused(f"load_lora_adapter {name}: {r['message']}")
            self._ok("/update_weight_version", self._post("/update_weight_version", {"new_version": str(version)}))
            old, self.lora = self.lora, name
            if old is not None and old != name:
                r = self._post("/v1/unload_lora_adapter", {"lora_name": old}, text=True)
                self._ok("/v1/unload_lora_adapter", r)
        elif self._loaded_at_start(v):
            # nothing to reload: the server started on exactly these tensors
            self._ok("/update_weight_version", self._post("/update_weight_version", {"new_version": str(version)}))
        else:
            self._ok("/pause", self._post("/pause?mode=wait"))
            try:
                if self._has_extension():  # the bundle's sync path: nothing unchecked is loaded
                    why = self._rpc("pcc_reload_weights", str(d)).get("refused")
                    if why:
                        raise ActivationRefused(f"pcc_reload_weights {d}: {why}")
                else:
                    r = self._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(d)}})
                    if isinstance(r, dict) and "_status" in r:
                        if _no_route(r):
                            self._ok("/collective_rpc", r)
                        raise ActivationRefused(f"reload_weights {d}: {r['message']}")
                reset = self._ok("/reset_prefix_cache", self._post("/reset_prefix_cache"))
                if not self._reply("/reset_prefix_cache", lambda: reset["success"]):
                    raise EngineError(f"{self.url}/reset_prefix_cache: the cache of version {version}'s "
                                      "predecessor could not be dropped (blocks still held)")
                self._ok("/update_weight_version", self._post("/update_weight_version", {"new_version": str(version)}))
            finally:
                self._ok("/resume", self._post("/resume"))
        self.manifests[version] = v.manifest

    def _loaded_at_start(self, v) -> bool:
        """Is full-weights version `v` what the server loaded when it started? Only before any version was set
        (/weight_info "default") and when the directory it serves (the base model card's `root`, on this
        machine) holds exactly v's tensors: every one with the dtype, shape and checksum of v's manifest."""
        from pathlib import Path

        from pcc.convert.source import ConvertError, open_source
        from pcc.runtime.sync import SyncError, verify

        if self.manifests or self._version() != -1:
            return False
        r = self._ok("/v1/models", self._post("/v1/models", method="GET"))
        roots = self._reply("/v1/models", lambda: [m.get("root") for m in r["data"] if m.get("parent") is None])
        root = Path(roots[0]) if roots and isinstance(roots[0], str) else None
        if root is None or not root.is_dir() or not any(root.glob("*.safetensors")):
            return False
        try:
            src = open_source(root)
        except ConvertError:
            return False
        try:
            verify(v.manifest, {name: src.load(name) for name in src.where})
        except SyncError:
            return False
        finally:
            src.close()
        return True

    def active(self) -> tuple[int, dict]:
        v = self._version()
        return v, self.manifests.get(v, {})

    def read_tensor(self, name: str) -> torch.Tensor:
        """A served tensor by checkpoint name, through pcc's worker extension. An adapter's lora_B comes back
        with vLLM's scaling folded in (lora/lora_weights.py optimize) and is divided by the alpha / rank pcc
        wrote (exact for a power-of-two scaling, as alpha = 2 x rank is)."""
        if not self._has_extension():
            raise NotServed(f"{self.url}: vLLM 0.32 returns no parameter values over HTTP (/weight_checker gives "
                            f"only checksums of its own processed parameters) and the server does not run pcc's "
                            f"worker extension (--worker-extension-cls), so {name} cannot be read back")
        adapter = ".lora_A." in name or ".lora_B." in name
        r = self._rpc("pcc_read_adapter" if adapter else "pcc_read_parameter", name)
        if "missing" in r:
            raise NotServed(f"{self.url}: pcc's worker extension cannot read {name}: {r['missing']}")
        t = self._reply("/collective_rpc", lambda: _tensor(r))
        if adapter and ".lora_B." in name:
            c = self.plan.contract.trainable
            t = t.float() / ((c.alpha or c.rank) / c.rank)
        return t


def _no_route(reply: dict) -> bool:
    """FastAPI's answer for a path no router registered ({"detail": "Not Found"}), not a vLLM ErrorResponse
    (an adapter path that does not exist is a 404 NotFoundError: a refusal)."""
    return reply.get("_status") == 404 and reply.get("message") == "HTTP 404: Not Found"


def _npy(b64: str, rows: int, arch) -> torch.Tensor:
    """vLLM's routed experts (utils/serial_utils.py numpy2base64: `.npy` bytes), the first `rows` tokens."""
    import numpy as np

    a = np.load(io.BytesIO(base64.b64decode(b64)), allow_pickle=False)
    if a.ndim != 3 or a.shape[0] < rows or a.shape[1:] != (arch.layers, arch.topk):
        raise ValueError(f"routed_experts of shape {a.shape}, expected [>= {rows}, {arch.layers}, {arch.topk}]")
    return torch.from_numpy(a[:rows].astype(np.int64))


def _tensor(r: dict) -> torch.Tensor:
    """{dtype, shape, data: base64 of the raw little-endian bytes} as the worker extension encodes a tensor."""
    dtype = getattr(torch, str(r["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype {r['dtype']!r} is not a torch dtype")
    shape = [int(n) for n in r["shape"]]
    raw = bytearray(base64.b64decode(r["data"], validate=True))
    n = 1
    for d in shape:
        n *= d
    if len(raw) != n * dtype.itemsize:
        raise ValueError(f"{len(raw)} bytes for a {r['dtype']} tensor of shape {shape}")
    return torch.frombuffer(raw, dtype=dtype).reshape(shape) if n else torch.empty(shape, dtype=dtype)
