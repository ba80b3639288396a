"""HttpEngine against servers that misbehave (127.0.0.1 only): each a one-line EngineError naming the
endpoint, in bounded time and memory, never a hang or a raw exception."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from pcc.validate import http_client
from pcc.validate.engine import EngineError
from pcc.validate.sglang_http import HttpEngine


class Server:
    """One socket server: `reply(conn)` answers each connection however the test wants."""

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
            conn.recv(65536)
            self.reply(conn, self.stop)
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


def _engine(url, tmp_path, timeout=2.0):
    return HttpEngine(url, tmp_path, plan=None, arch=None, timeout=timeout)


def test_a_server_that_sends_a_byte_a_second_is_cut_off(tmp_path):
    def drip(conn, stop):
        for b in _http("200 OK", b'{"weight_version": "1"}' * 50):
            if stop.is_set():
                return
            conn.sendall(bytes([b]))
            time.sleep(0.5)

    with Server(drip) as s:
        t0 = time.monotonic()
        with pytest.raises(EngineError, match=rf"{s.url}/get_model_info: .*(deadline|within 2 s)"):
            _engine(s.url, tmp_path).active()
        assert time.monotonic() - t0 < 5


def test_a_server_that_never_answers_times_out(tmp_path):
    with Server(lambda conn, stop: stop.wait(10)) as s:
        t0 = time.monotonic()
        with pytest.raises(EngineError, match="/get_model_info"):
            _engine(s.url, tmp_path, timeout=1.0).active()
        assert time.monotonic() - t0 < 4


def test_bad_json_names_the_endpoint(tmp_path):
    with Server(lambda conn, stop: conn.sendall(_http("200 OK", b"{not json"))) as s:
        with pytest.raises(EngineError, match=r"/get_model_info: the reply is not JSON"):
            _engine(s.url, tmp_path).active()


def test_a_body_over_the_cap_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(http_client, "MAX_REPLY", 1 << 16)
    with Server(lambda conn, stop: conn.sendall(_http("200 OK", b"[" + b"1," * 100000 + b"1]"))) as s:
        with pytest.raises(EngineError, match="larger than"):
            _engine(s.url, tmp_path).active()


def test_http_500_is_a_refusal_with_the_status(tmp_path):
    with Server(lambda conn, stop: conn.sendall(_http("500 Internal Server Error", b'{"message": "boom"}'))) as s:
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

    with Server(lambda conn, stop: conn.sendall(_http("200 OK", body))) as s:
        e = _engine(s.url, tmp_path)
        e.arch = Arch()
        with pytest.raises(EngineError, match=what):
            e.generate(torch.zeros(1, 2, dtype=torch.long), 2, 0)


def test_get_model_info_of_the_wrong_shape(tmp_path):
    with Server(lambda conn, stop: conn.sendall(_http("200 OK", b'{"weight_version": "v1"}'))) as s:
        with pytest.raises(EngineError, match="/get_model_info: the reply is not what SGLang sends"):
            _engine(s.url, tmp_path).active()


def test_nothing_listening(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(EngineError, match=rf"127.0.0.1:{port}/get_model_info: .*refused"):
        _engine(f"http://127.0.0.1:{port}", tmp_path).active()
