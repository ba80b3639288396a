"""A server on 127.0.0.1 for the endpoints VllmEngine uses, whose requests are parsed and replies built
with vLLM 0.32's own protocol classes (CompletionRequest, CompletionResponse, ModelList,
LoadLoRAAdapterRequest, PEFTHelper, ErrorResponse, Logprob, numpy2base64): a field vLLM does not know is a 400
here, as it is ignored there. Log-probs come from the embedded runtime's rollout engine (the tiny
torch model) on the version installed through the same reload / adapter endpoints; whether a version
is refused is that engine's verdict (it checks pcc's manifest, vLLM does not), given where vLLM
answers: at reload, or when the adapter is loaded.

Run as a child process (vLLM's imports stay out of pytest): `python vllm_stub.py CONTRACT [MODEL]`
(MODEL as `pcc validate --model`). It prints
`pcc-vllm-stub PORT <n>`, serves at most MAX_REQUESTS requests, and exits when stdin closes or after
LIFETIME seconds.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import torch

LIFETIME, MAX_REQUESTS = 300.0, 3000
BASE = "pcc-stub-model"


def main(contract: str, model: str | None = None) -> None:
    sys.path.append(os.environ.get("PCC_VLLM_DIR") or str(Path(sys.prefix) / "engines" / "vllm"))
    from pydantic import ValidationError
    from safetensors.torch import load_file
    from vllm.entrypoints.openai.completion.protocol import (CompletionLogProbs, CompletionRequest,
                                                             CompletionResponse, CompletionResponseChoice)
    from vllm.entrypoints.serve.engine.protocol import ErrorInfo, ErrorResponse, ModelCard, ModelList, UsageInfo
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
    from vllm.exceptions import VLLMError
    from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
    from vllm.logprobs import Logprob
    from vllm.lora.peft_helper import PEFTHelper
    from vllm.utils.serial_utils import numpy2base64

    from pcc.runtime.contract import compile_for_runtime
    from pcc.runtime.model import Arch, forward
    from pcc.runtime.session import set_threads
    from pcc.validate.engine import ActivationRefused, Version
    from pcc.validate.local import LocalEngine

    set_threads()  # PCC_THREADS, as the tests run
    plan = compile_for_runtime(contract, model).plan
    arch = Arch.from_catalog(plan.catalog)
    engine = LocalEngine(plan, arch)
    state = {"version": "default", "adapters": {}, "paused": False}  # paused: completions wait, as in vLLM
    c = plan.contract
    returns_routes = c.routing_replay == "r3" or "experts" in c.rollout.record  # as pcc.lower.vllm launches it
    lock = threading.Condition()

    class BadRequest(Exception):
        pass

    def error(code: int, message: str):
        return code, ErrorResponse(error=ErrorInfo(message=message, type="BadRequestError", code=code)).model_dump()

    def parse(cls, body):
        try:
            req = cls.model_validate(body)
        except ValidationError as exc:
            raise BadRequest(str(exc).splitlines()[0]) from None
        extra = set(body) - set(cls.model_fields)
        if extra:  # vLLM would only log these and ignore them: the client meant something vLLM does not do
            raise BadRequest(f"fields {sorted(extra)} are not {cls.__name__} fields")
        return req

    def log_softmax(rows: list[list[int]]):
        """Log-probs [T, V] for each row and its expert ids [T, layers, k], batched by length."""
        out = [None] * len(rows)
        ex = engine.rollout._exec(engine.rollout.active)
        by_len: dict[int, list[int]] = {}
        for i, r in enumerate(rows):
            by_len.setdefault(len(r), []).append(i)
        for idx in by_len.values():
            with torch.no_grad():
                logits, routes = forward(arch, ex, torch.tensor([rows[i] for i in idx]))
            lsm = torch.log_softmax(logits.double(), -1)
            used = torch.stack(routes.used, 2) if routes.used else None  # [B, T, layers, k]
            for j, i in enumerate(idx):
                out[i] = (lsm[j], None if used is None else used[j])
        return out

    def completion(body: dict):
        req = parse(CompletionRequest, body)
        if req.model != BASE and req.model not in state["adapters"]:
            return error(404, f"The model `{req.model}` does not exist.")
        if req.model in state["adapters"] and engine.active()[0] != state["adapters"][req.model]:
            engine.activate(state["adapters"][req.model])
        if not (isinstance(req.prompt, list) and req.prompt and all(isinstance(p, list) for p in req.prompt)):
            raise BadRequest("this stub takes token id lists only")
        sp = req.to_sampling_params(req.max_tokens)
        if (sp.temperature, sp.top_p, sp.top_k, sp.min_p) != (1.0, 1.0, 0, 0.0) or req.stream or sp.n != 1:
            raise BadRequest("this stub samples at temperature 1, unfiltered, one choice, no stream")
        if sp.prompt_logprobs not in (None, 0) or sp.logprobs not in (None, 0):
            raise BadRequest("this stub returns the chosen tokens' log-probs only (0)")
        as_id = bool(req.return_tokens_as_token_ids)
        seed = sp.seed if sp.seed is not None else int(time.time_ns()) % 2**62
        gens = [torch.Generator().manual_seed(seed) for _ in req.prompt]  # vLLM seeds each prompt's request alike
        seqs, steps, final = [list(p) for p in req.prompt], [[] for _ in req.prompt], []
        for _ in range(sp.max_tokens):  # every step a full forward of every row: no request state to get wrong
            final = log_softmax(seqs)  # at the last step: what vLLM forwarded, all but the last sampled token
            for i, (lsm, _) in enumerate(final):
                last = lsm[-1]
                tok = int(torch.multinomial(last.exp(), 1, generator=gens[i]))
                steps[i].append({t: Logprob(float(last[t]), int((last > last[t]).sum()) + 1, None)
                                 for t in [tok, *(sp.logprob_token_ids or [])]})
                seqs[i].append(tok)
        choices, n_prompt, n_gen = [], 0, 0
        for i, prompt in enumerate(req.prompt):
            out, (lsm, used) = seqs[i][len(prompt):], final[i]
            plp = None
            if sp.prompt_logprobs is not None:
                plp = [None] + [{prompt[j]: Logprob(float(lsm[j - 1, prompt[j]]),
                                                    int((lsm[j - 1] > lsm[j - 1, prompt[j]]).sum()) + 1, None)}
                                for j in range(1, len(prompt))]
            echo0 = req.echo and req.max_tokens == 0
            logprobs = None
            if req.logprobs is not None:
                ids, lps = (prompt, plp) if echo0 else (out, steps[i])
                name = (lambda t: f"token_id:{t}") if as_id else (lambda t: "")
                logprobs = CompletionLogProbs(
                    text_offset=[0] * len(ids), tokens=[name(t) for t in ids],
                    token_logprobs=[None if d is None else d[t].logprob for t, d in zip(ids, lps)],
                    top_logprobs=[None if d is None else {name(k): v.logprob for k, v in d.items()} for d in lps])
            routed = None
            if used is not None and returns_routes:  # vllm serve --enable-return-routed-experts
                routed = numpy2base64(used[req.routed_experts_prompt_start:].to(torch.int32).numpy())
            choices.append(CompletionResponseChoice(
                index=i, text="", logprobs=logprobs, finish_reason="length", prompt_logprobs=plp,
                prompt_token_ids=list(prompt) if req.return_token_ids else None,
                token_ids=out if req.return_token_ids else None, routed_experts=routed))
            n_prompt, n_gen = n_prompt + len(prompt), n_gen + len(out)
        resp = CompletionResponse(model=req.model, choices=choices,
                                  usage=UsageInfo(prompt_tokens=n_prompt, completion_tokens=n_gen,
                                                  total_tokens=n_prompt + n_gen))
        return 200, resp.model_dump()

    def load_dir(d: Path, moves: str, file: str) -> Version:
        man = json.loads((d / "pcc_manifest.json").read_text())
        t = {k.removeprefix("base_model.model."): v for k, v in load_file(str(d / file)).items()}
        return Version(man["version"], moves, t, man)

    def handle(method: str, path: str, query: dict, body: dict):
        if method == "GET" and path == "/v1/models":
            cards = [ModelCard(id=BASE, root=BASE)] + [ModelCard(id=n, root=n, parent=BASE) for n in state["adapters"]]
            return 200, ModelList(data=cards).model_dump()
        if method == "GET" and path == "/weight_info":
            return 200, {"weight_version": state["version"]}
        if path == "/v1/completions":
            return completion(body)
        if path == "/v1/load_lora_adapter":
            req = parse(LoadLoRAAdapterRequest, body)
            if not req.load_inplace and req.lora_name in state["adapters"]:  # serving.py _check_load_lora_adapter_request
                return error(400, f"The lora adapter '{req.lora_name}' has already been loaded. If you want to load "
                                  "the adapter in place, set 'load_inplace' to True.")
            v = load_dir(Path(req.lora_path), "adapter", "adapter_model.safetensors")
            peft = PEFTHelper.from_dict(json.loads((Path(req.lora_path) / "adapter_config.json").read_text()))
            engine.rollout.lora_scaling = peft.vllm_lora_scaling_factor
            engine.install(v)
            prev = engine.active()[0]
            try:  # vLLM loads an adapter when asked, not at first use: refuse it now, keep serving the old one
                engine.activate(v.version)
            except ActivationRefused as exc:
                return error(400, str(exc))
            finally:
                engine.activate(prev)
            state["adapters"][req.lora_name] = v.version
            return 200, f"Success: LoRA adapter '{req.lora_name}' added successfully."
        if path == "/v1/unload_lora_adapter":
            req = parse(UnloadLoRAAdapterRequest, body)
            if state["adapters"].pop(req.lora_name, None) is None:
                return error(404, f"The lora adapter '{req.lora_name}' cannot be found.")
            return 200, f"Success: LoRA adapter '{req.lora_name}' removed successfully."
        if path == "/collective_rpc":
            if body.get("method") != "reload_weights":  # no worker extension here: vLLM's answer to an unknown
                # method (run_method's NotImplementedError, v1/engine/core.py _invoke_utility_method)
                return 500, {"error": {"message": "Call to collective_rpc method failed: Method "
                                       f"{body.get('method')!r} is not implemented.", "code": 500}}
            if set(body.get("kwargs", {})) != {"weights_path"}:
                raise BadRequest(f"this stub runs reload_weights(weights_path=...) only, not {body}")
            v = load_dir(Path(body["kwargs"]["weights_path"]), "full_weights", "model.safetensors")
            engine.install(v)
            try:
                engine.activate(v.version)
            except ActivationRefused:  # the worker raised: FastAPI's unhandled-exception reply
                return 500, "Internal Server Error"
            return 200, {"results": [None]}
        if path == "/reset_prefix_cache":
            return 200, {"success": True}
        if path == "/pause":
            if query.get("mode", ["abort"]) != ["wait"]:
                raise BadRequest(f"pause mode {query.get('mode')}: the client must wait for requests in flight")
            state["paused"] = True
            return 200, {"status": "paused"}
        if path == "/resume":
            state["paused"] = False
            lock.notify_all()
            return 200, {"status": "resumed"}
        if path == "/update_weight_version":
            if set(body) != {"new_version"} or not isinstance(body["new_version"], str):
                raise BadRequest(f"update_weight_version takes {{new_version: str}}, not {body}")
            state["version"] = body["new_version"]
            return 200, {"success": True, "new_version": body["new_version"]}
        return 404, {"detail": "Not Found"}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _serve(self, method: str):
            url = urlsplit(self.path)
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with lock:
                if url.path == "/v1/completions":
                    lock.wait_for(lambda: not state["paused"], 60)
                try:
                    code, doc = handle(method, url.path, parse_qs(url.query), json.loads(raw or b"{}"))
                except BadRequest as exc:
                    code, doc = error(400, str(exc))
                except VLLMError as exc:  # vLLM's validators: the status its server maps them to
                    err = create_error_response(exc)
                    code, doc = err.error.code, err.model_dump()
                except Exception:  # noqa: BLE001 - what FastAPI answers for an unhandled exception
                    traceback.print_exc()
                    code, doc = 500, "Internal Server Error"
            data = doc.encode() if isinstance(doc, str) else json.dumps(doc, allow_nan=False).encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if isinstance(doc, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._serve("GET")

        def do_POST(self):
            self._serve("POST")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.timeout = 0.2
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    print(f"pcc-vllm-stub PORT {server.server_address[1]}", flush=True)
    deadline, left = time.monotonic() + LIFETIME, MAX_REQUESTS
    while left > 0 and time.monotonic() < deadline and not done.is_set():
        server.handle_request()
        left -= 1
    server.server_close()


if __name__ == "__main__":
    main(*sys.argv[1:3])
