"""The SGLang and vLLM clients against servers that misbehave (127.0.0.1 only): each a one-line
EngineError naming the endpoint, in bounded time and memory, never a hang or a raw exception."""

from __future__ import annotations

import json

import socket
import threading
import time

import pytest

from pcc.validate import http_client
from pcc.validate.engine import ActivationRefused, EngineError, NotServed, Version
from pcc.validate.sglang_http import HttpEngine
from pcc.validate.vllm_http import VllmEngine

# each client, and the endpoint its active() asks
ENGINES = pytest.mark.parametrize("cls, info", [(HttpEngine, "/get_model_info"), (VllmEngine, "/weight_info")])


class Server:
    """One socket server: `reply(conn, stop, request bytes)` answers each connection however the test wants."""

    def __init__(self, reply):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.reply, self.stop = reply, threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        try:
            self.reply(conn, self.stop, conn.recv(65536))
        except OSError:
            pass
        finally:
            conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.sock.close()


def _http(status: str, body: bytes) -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


def _body(conn, req: bytes) -> tuple[bytes, bytes]:
    """(head, body) of a request, the body read to its Content-Length (it may come in a later packet)."""
    head, _, body = req.partition(b"\r\n\r\n")
    size = next((int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")), 0)
    while len(body) < size:
        body += conn.recv(65536)
    return head, body


def _engine(url, tmp_path, timeout=2.0, cls=HttpEngine):
    return cls(url, tmp_path, plan=None, arch=None, timeout=timeout)


@ENGINES
def test_a_server_that_sends_a_byte_a_second_is_cut_off(tmp_path, cls, info):
    def drip(conn, stop, req):
        for b in _http("200 OK", b'{"weight_version": "1"}' * 50):
            if stop.is_set():
                return
            conn.sendall(bytes([b]))
            time.sleep(0.5)

    with Server(drip) as s:
        t0 = time.monotonic()
        with pytest.raises(EngineError, match=rf"{s.url}{info}: .*(deadline|within 2 s)"):
            _engine(s.url, tmp_path, cls=cls).active()
        assert time.monotonic() - t0 < 5


@ENGINES
def test_a_server_that_never_answers_times_out(tmp_path, cls, info):
    with Server(lambda conn, stop, req: stop.wait(10)) as s:
        t0 = time.monotonic()
        with pytest.raises(EngineError, match=info):
            _engine(s.url, tmp_path, timeout=1.0, cls=cls).active()
        assert time.monotonic() - t0 < 4


@ENGINES
def test_bad_json_names_the_endpoint(tmp_path, cls, info):
    with Server(lambda conn, stop, req: conn.sendall(_http("200 OK", b"{not json"))) as s:
        with pytest.raises(EngineError, match=rf"{info}: the reply is not JSON"):
            _engine(s.url, tmp_path, cls=cls).active()


@ENGINES
def test_a_body_over_the_cap_is_refused(tmp_path, monkeypatch, cls, info):
    monkeypatch.setattr(http_client, "MAX_REPLY", 1 << 16)
    with Server(lambda conn, stop, req: conn.sendall(_http("200 OK", b"[" + b"1," * 100000 + b"1]"))) as s:
        with pytest.raises(EngineError, match="larger than"):
            _engine(s.url, tmp_path, cls=cls).active()


def test_http_500_is_a_refusal_with_the_status(tmp_path):
    with Server(lambda conn, stop, req: conn.sendall(_http("500 Internal Server Error", b'{"message": "boom"}'))) as s:
        e = _engine(s.url, tmp_path)
        assert e._post("/update_weights_from_disk", {}) == {"success": False, "message": "HTTP 500: boom",
                                                            "_status": 500}
        with pytest.raises(EngineError, match=r"/generate: HTTP 500: boom"):
            e._generate([[1, 2]], {}, False)


@pytest.mark.parametrize("body, what", [(b'[{"meta_info": {}}]', "/generate: the reply is not what SGLang sends"),
                                        (b'"text"', "/generate: expected one result per sequence"),
                                        (b"[1, 2, 3]", "/generate: expected one result per sequence")])
def test_a_reply_of_the_wrong_shape(tmp_path, body, what):
    import torch

    class Arch:
        is_moe = False

    with Server(lambda conn, stop, req: conn.sendall(_http("200 OK", body))) as s:
        e = _engine(s.url, tmp_path)
        e.arch = Arch()
        with pytest.raises(EngineError, match=what):
            e.generate(torch.zeros(1, 2, dtype=torch.long), 2, 0)


@ENGINES
def test_the_weight_version_of_the_wrong_shape(tmp_path, cls, info):
    with Server(lambda conn, stop, req: conn.sendall(_http("200 OK", b'{"weight_version": "v1"}'))) as s:
        with pytest.raises(EngineError, match=f"{info}: the reply is not what {cls.server} sends"):
            _engine(s.url, tmp_path, cls=cls).active()


@pytest.mark.parametrize("body, what", [(b'{"choices": [{"index": 0}]}', "the reply is not what vLLM sends"),
                                        (b'"text"', "the reply is not what vLLM sends"),
                                        (b'{"choices": []}', r"expected one choice per prompt \(1\), got 0")])
def test_a_vllm_completion_of_the_wrong_shape(tmp_path, body, what):
    import torch

    with Server(lambda conn, stop, req: conn.sendall(_http("200 OK", body))) as s:
        e = _engine(s.url, tmp_path, cls=VllmEngine)
        e.base = "m"  # the served model, as /v1/models would name it
        with pytest.raises(EngineError, match=f"/v1/completions: {what}"):
            e.generate(torch.zeros(1, 2, dtype=torch.long), 2, 0)


def test_a_vllm_error_response_is_named(tmp_path):
    import torch

    err = b'{"error": {"message": "boom", "type": "InternalServerError", "param": null, "code": 500}}'
    with Server(lambda conn, stop, req: conn.sendall(_http("500 Internal Server Error", err))) as s:
        with pytest.raises(EngineError, match=r"/v1/models: HTTP 500: boom"):
            _engine(s.url, tmp_path, cls=VllmEngine).generate(torch.zeros(1, 2, dtype=torch.long), 2, 0)


def _routes(table: dict, seen: list):
    """A reply per path (the first line of the request), each path recorded in `seen`."""
    def reply(conn, stop, req):
        path = req.split(b" ", 2)[1].decode().split("?")[0]
        seen.append(path)
        status, body = table[path]
        conn.sendall(_http(status, body))

    return reply


def test_a_failed_vllm_reload_is_refused_and_the_server_resumed(tmp_path):
    seen: list = []
    table = {"/pause": ("200 OK", b'{"status": "paused"}'), "/resume": ("200 OK", b'{"status": "resumed"}'),
             "/collective_rpc": ("500 Internal Server Error", b"Internal Server Error"),
             "/weight_info": ("200 OK", b'{"weight_version": "0"}')}  # a version was set: a reload is needed
    with Server(_routes(table, seen)) as s:
        e = _engine(s.url, tmp_path, cls=VllmEngine)
        e.installed[1] = (Version(1, "full_weights", {}), tmp_path)
        with pytest.raises(ActivationRefused, match=r"reload_weights .*: HTTP 500: Internal Server Error"):
            e.activate(1)
    # the extension probe (an HTTP error: none), then vLLM's own reload_weights
    assert seen == ["/weight_info", "/pause", "/collective_rpc", "/collective_rpc", "/resume"]


@pytest.mark.parametrize("status", ["400 Bad Request", "404 Not Found"])  # 404: vLLM's LoRAAdapterNotFoundError
def test_a_refused_vllm_adapter_is_refused(tmp_path, status):
    err = b'{"error": {"message": "Invalid LoRA adapter", "type": "BadRequestError", "param": null, "code": 400}}'
    with Server(lambda conn, stop, req: conn.sendall(_http(status, err))) as s:
        e = _engine(s.url, tmp_path, cls=VllmEngine)
        e.installed[1] = (Version(1, "adapter", {}), tmp_path)
        with pytest.raises(ActivationRefused, match=r"load_lora_adapter pcc-v1-.*: HTTP 40[04]: Invalid LoRA adapter"):
            e.activate(1)
        assert e.lora is None


NOT_IMPLEMENTED = (b'{"error": {"message": "Call to collective_rpc method failed: Method \'pcc_extension\' is not '
                   b'implemented.", "type": "InternalServerError", "param": null, "code": 500}}')


def test_vllm_without_the_extension_cannot_read_a_tensor_back(tmp_path):
    table = {"/collective_rpc": ("500 Internal Server Error", NOT_IMPLEMENTED)}
    with Server(_routes(table, [])) as s:
        with pytest.raises(NotServed, match="vLLM 0.32 returns no parameter values over HTTP"):
            _engine(s.url, tmp_path, cls=VllmEngine).read_tensor("model.layers.0.mlp.down_proj.weight")


def _extension(replies: list, seen: list):
    """A vLLM server running pcc's worker extension: the probe answered, then `replies` in order (the rpc's
    results, or a raw reply), every request body recorded in `seen`."""
    def reply(conn, stop, req):
        body = json.loads(_body(conn, req)[1] or b"{}")
        seen.append(body.get("method"))
        out = {"results": [{"pcc_worker_extension": 1}]} if body.get("method") == "pcc_extension" else replies.pop(0)
        conn.sendall(_http("200 OK", json.dumps(out).encode()))

    return reply


@pytest.mark.parametrize("reply,error", [
    ({"results": [{"dtype": "bfloat16", "shape": [2, 2], "data": "AAAA"}]}, "3 bytes for a bfloat16 tensor"),
    ({"results": [{"dtype": "float32", "shape": [1], "data": "!!"}]}, "Only base64 data is allowed"),
    ({"results": ["a string"]}, "not what pcc's worker extension sends"),
    ({"results": [{"dtype": "Tensor", "shape": [], "data": ""}]}, "not a torch dtype"),
])
def test_a_malformed_read_back_is_an_engine_error(tmp_path, reply, error):
    seen: list = []
    with Server(_extension([reply], seen)) as s:
        with pytest.raises(EngineError, match=error):
            _engine(s.url, tmp_path, cls=VllmEngine).read_tensor("model.layers.0.mlp.down_proj.weight")
    assert seen == ["pcc_extension", "pcc_read_parameter"]


def test_a_sharded_or_missing_read_back_is_not_served(tmp_path):
    two = {"results": [{"dtype": "float32", "shape": [], "data": "AAAAAA=="}] * 2}
    missing = {"results": [{"missing": "model.layers.0.mlp has no tensor weight"}]}
    with Server(_extension([two, missing], [])) as s:
        e = _engine(s.url, tmp_path, cls=VllmEngine)
        with pytest.raises(NotServed, match="2 workers answered pcc_read_parameter"):
            e.read_tensor("model.layers.0.mlp.down_proj.weight")
        with pytest.raises(NotServed, match="cannot read .*: model.layers.0.mlp has no tensor weight"):
            e.read_tensor("model.layers.0.mlp.down_proj.weight")


def test_a_refusal_of_the_extension_is_a_refusal_and_the_server_resumed(tmp_path):
    seen: list = []
    refused = {"results": [{"refused": "version 1: tensor 'lm_head.weight' fails its sha256 (damaged)"}]}
    pause, ok = {"status": "paused"}, {"status": "resumed"}
    with Server(_extension([{"weight_version": "0"}, pause, refused, ok], seen)) as s:
        e = _engine(s.url, tmp_path, cls=VllmEngine)
        e.installed[1] = (Version(1, "full_weights", {}), tmp_path)
        with pytest.raises(ActivationRefused, match=r"pcc_reload_weights .*: version 1: .* fails its sha256"):
            e.activate(1)
    assert seen == [None, None, "pcc_extension", "pcc_reload_weights", None]  # weight_info, pause, ..., resume


@ENGINES
def test_nothing_listening(tmp_path, cls, info):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(EngineError, match=rf"127.0.0.1:{port}{info}: .*refused"):
        _engine(f"http://127.0.0.1:{port}", tmp_path, cls=cls).active()


def test_a_vllm_server_without_dev_mode_says_so(tmp_path):
    with Server(lambda conn, stop, req: conn.sendall(_http("404 Not Found", b'{"detail": "Not Found"}'))) as s:
        e = _engine(s.url, tmp_path, cls=VllmEngine)
        with pytest.raises(EngineError, match=r"/weight_info: HTTP 404: Not Found \(vLLM serves it only when "
                                              r"started with VLLM_SERVER_DEV_MODE=1\)"):
            e.active()
        e.installed[1] = (Version(1, "adapter", {}), tmp_path)
        with pytest.raises(EngineError, match=r"only when started with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True") as exc:
            e.activate(1)
        assert not isinstance(exc.value, ActivationRefused)  # a missing endpoint is not a verdict on the version


def _adapter_server(loaded: set, calls: list):
    """vLLM's adapter endpoints as its serving.py answers them: a name it holds is refused (HTTP 400)."""
    def reply(conn, stop, req):
        head, body = _body(conn, req)
        path = head.split(b" ", 2)[1].decode().split("?")[0]
        doc = json.loads(body or b"{}")
        calls.append((path, doc.get("lora_name")))
        if path == "/v1/load_lora_adapter":
            if doc["lora_name"] in loaded and not doc.get("load_inplace"):
                msg = (f"The lora adapter '{doc['lora_name']}' has already been loaded. If you want to load the "
                       "adapter in place, set 'load_inplace' to True.")
                conn.sendall(_http("400 Bad Request", json.dumps({"error": {"message": msg, "code": 400}}).encode()))
                return
            loaded.add(doc["lora_name"])
            conn.sendall(_http("200 OK", f"Success: LoRA adapter '{doc['lora_name']}' added successfully.".encode()))
        elif path == "/v1/unload_lora_adapter":
            loaded.discard(doc["lora_name"])
            conn.sendall(_http("200 OK", b"Success"))
        elif path == "/collective_rpc":  # no worker extension: the probe is vLLM's "not implemented"
            conn.sendall(_http("500 Internal Server Error", NOT_IMPLEMENTED))
        else:
            conn.sendall(_http("200 OK", b'{"success": true}'))

    return reply


def test_a_version_installed_again_gets_its_own_adapter_name_and_directory(tmp_path):
    """Level 6 installs a partial and a damaged copy of version N before the real one. A real vLLM loads the
    first two (it checks no manifest), so a copy that reused a directory or an adapter name was HTTP 400
    "has already been loaded ... set 'load_inplace' to True" (issue 28): each install is its own directory
    and name, and activating the active adapter again loads nothing."""
    from types import SimpleNamespace

    import torch

    plan = SimpleNamespace(contract=SimpleNamespace(trainable=SimpleNamespace(rank=8, alpha=16)))
    loaded, calls = set(), []
    key = "model.layers.0.self_attn.q_proj.lora_B.weight"
    with Server(_adapter_server(loaded, calls)) as s:
        e = VllmEngine(s.url, tmp_path, plan=plan, arch=None, timeout=5.0)
        for i in range(3):  # missing, damaged, real: the same version number three times
            e.install(Version(1, "adapter", {key: torch.full((4, 8), float(i))}, {"version": 1, "copy": i}))
            e.activate(1)
        e.activate(1)  # already active: nothing to load
    loads = [n for p, n in calls if p == "/v1/load_lora_adapter"]
    assert len(loads) == 3 and len(set(loads)) == 3, loads
    assert loaded == {e.lora} and e.lora == loads[-1]
    dirs = sorted(p.parent for p in tmp_path.glob("v1-*/adapter_model.safetensors"))
    assert len(dirs) == 3  # no copy written over another the server may hold
