"""A server on 127.0.0.1 that speaks SGLang's HTTP shapes for the endpoints HttpEngine uses,
backed by the embedded runtime's rollout engine. Bounded: it serves at most `max_requests`
and stops by itself after `lifetime` seconds."""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch
from safetensors.torch import load_file

from pcc.validate.engine import ActivationRefused, Version


class Stub:
    def __init__(self, engine, lifetime: float = 120.0, max_requests: int = 2000):
        self.engine, self.lock, self.version_str = engine, threading.Lock(), "0"
        self.adapters: dict[str, int] = {}
        self.left, self.deadline = max_requests, time.monotonic() + lifetime
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _reply(self, code, doc):
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._reply(200, {"weight_version": stub.version_str, "model_path": "stub"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with stub.lock:
                    code, doc = stub.handle(self.path, body)
                self._reply(code, doc)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.timeout = 0.2
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        while self.left > 0 and time.monotonic() < self.deadline and not getattr(self, "stopped", False):
            self.server.handle_request()
            self.left -= 1
        self.server.server_close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped = True
        self.thread.join(timeout=5)

    def handle(self, path: str, b: dict):
        e = self.engine
        if path == "/flush_cache":
            return 200, {"success": True}
        if path == "/update_weight_version":
            self.version_str = b["new_version"]
            return 200, {"success": True, "new_version": self.version_str}
        if path == "/update_weights_from_disk":
            d = Path(b["model_path"])
            man = json.loads((d / "pcc_manifest.json").read_text())
            e.install(Version(man["version"], "full_weights", load_file(str(d / "model.safetensors")), man))
            try:
                e.activate(man["version"])
            except ActivationRefused as exc:
                return 400, {"success": False, "message": str(exc)}
            self.version_str = b.get("weight_version") or self.version_str
            return 200, {"success": True, "message": "Succeeded to update model weights."}
        if path == "/load_lora_adapter":
            d = Path(b["lora_path"])
            man = json.loads((d / "pcc_manifest.json").read_text())
            t = {k.removeprefix("base_model.model."): v for k, v in load_file(str(d / "adapter_model.safetensors")).items()}
            e.install(Version(man["version"], "adapter", t, man))
            self.adapters[b["lora_name"]] = man["version"]
            return 200, {"success": True, "loaded_adapters": sorted(self.adapters)}
        if path == "/unload_lora_adapter":
            self.adapters.pop(b["lora_name"], None)
            return 200, {"success": True, "loaded_adapters": sorted(self.adapters)}
        if path == "/get_weights_by_name":
            return 200, e.read_tensor(b["name"])[: b.get("truncate_size", 100)].tolist()
        if path == "/generate":
            return 200, self.generate(b)
        return 404, {"success": False, "message": f"no route {path}"}

    def generate(self, b: dict):
        e = self.engine
        lora = b.get("lora_path")
        if lora:
            want = self.adapters[lora[0] if isinstance(lora, list) else lora]
            if e.active()[0] != want:
                e.activate(want)
        ids = torch.tensor(b["input_ids"])
        sp = b["sampling_params"]
        meta = {"weight_version": self.version_str, "prompt_tokens": ids.shape[1]}
        if sp["max_new_tokens"] == 0:
            s = e.score(ids, 1, routes=b.get("return_routed_experts", False))
            out = []
            for n in range(ids.shape[0]):
                lps = [[None, int(ids[n, 0]), None]] + [[float(s.logp[n, j]), int(ids[n, j + 1]), None]
                                                        for j in range(ids.shape[1] - 1)]
                m = {**meta, "input_token_logprobs": lps, "output_token_logprobs": []}
                if s.routes is not None:
                    r = torch.stack([x[n] for x in s.routes], 1).to(torch.int32)  # [T-1, layers, k]
                    m["routed_experts"] = base64.b64encode(r.numpy().tobytes()).decode("ascii")
                out.append({"text": "", "output_ids": [], "meta_info": m})
            return out
        g = e.generate(ids, sp["max_new_tokens"], sp.get("sampling_seed", 0))
        p = ids.shape[1]
        return [{"text": "", "output_ids": g.tokens[n, p:].tolist(),
                 "meta_info": {**meta, "output_token_logprobs": [[float(g.logp[n, j]), int(g.tokens[n, p + j]), None]
                                                                  for j in range(g.logp.shape[1])]}}
                for n in range(ids.shape[0])]
