"""What the SGLang and vLLM clients share (stdlib urllib only): one request with a total deadline, a
socket timeout and a reply size cap, every failure an EngineError naming the endpoint; and the
on-disk form of a version (a rollout checkpoint or a PEFT adapter, plus pcc_manifest.json) that
both servers load from a path.
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import torch

from pcc.lang.outputs import atomic_path, write_atomic

from .engine import EngineError, Version

TIMEOUT = 120.0  # the total deadline of one request: connect, headers and the whole body
SOCKET_TIMEOUT = 30.0  # connect, and each read of the socket
MAX_REPLY = 256 << 20  # get_weights_by_name of 1M values as JSON is ~20 MB; more is not an answer to us


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is refused, never followed: pcc validates the engine it was given, and a 3xx to another
    host or port would have it measure (and install versions into) another service."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        fp.close()
        raise EngineError(f"{req.full_url}: HTTP {code} redirect to {newurl!r} (Location "
                          f"{headers.get('Location')!r}); pcc follows no redirect from an engine: give --engine the "
                          "URL that serves it")


_OPENER = urllib.request.build_opener(_NoRedirect)


class HttpClient:
    """The base of an engine over HTTP: requests, reply checking and version directories."""

    server = "the server"  # named when a reply has the wrong shape, and (lower case) in the engine's name

    def __init__(self, url: str, versions_dir: Path, plan, arch, timeout: float = TIMEOUT):
        self.url, self.dir, self.plan, self.arch, self.timeout = url.rstrip("/"), Path(versions_dir), plan, arch, timeout
        self.installed: dict[int, tuple[Version, Path]] = {}
        self.installs = 0  # every install gets its own directory, even a version installed again
        self.manifests: dict[int, dict] = {}
        self.lora: str | None = None
        self.name = f"{self.server.lower()} {self.url}"

    def _post(self, path: str, body: dict | None = None, method: str = "POST", text: bool = False):
        """One request with a total deadline (`timeout`: a server that sends a byte a second is cut off), a
        socket timeout, and a reply size cap; every failure an EngineError naming the endpoint. An HTTP
        error status is a reply {"success": False, "message", "_status"} for the caller to judge.
        `text`: the reply is plain text (vLLM's LoRA endpoints), returned as a str."""
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
            return {"success": False, "message": f"HTTP {status}: {_message(raw)}", "_status": status}
        if text:
            return raw.decode(errors="replace")
        try:
            return json.loads(raw or b"null")
        except ValueError as exc:
            raise EngineError(f"{where}: the reply is not JSON ({exc}): {raw[:80]!r}") from None

    def _fetch(self, req, where: str, deadline: float) -> tuple[int | None, bytes]:
        """(HTTP error status or None, body), read in pieces against the deadline and MAX_REPLY."""
        try:
            with _OPENER.open(req, timeout=min(SOCKET_TIMEOUT, self.timeout)) as resp:
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
            raise EngineError(f"{self.url}{what}: the reply is not what {self.server} sends ({type(exc).__name__}: "
                              f"{exc})") from None

    def install(self, version: Version) -> None:
        """Write the version where the server can read it: a checkpoint (config.json with the converter's
        quantization_config) or a PEFT adapter, each with its manifest; activation loads it."""
        from safetensors.torch import save_file

        from pcc.lower.converter import converter_plan

        # A directory per install, never reused: a version installed again (level 6 sends a partial and a
        # damaged copy of version N before the real one) must not overwrite a copy the server may have
        # loaded, and vLLM names an adapter after it (a reused name is HTTP 400 "already been loaded").
        self.installs += 1
        d = self.dir / f"v{version.version}-{self.installs}"
        d.mkdir(parents=True, exist_ok=True)
        if version.moves == "adapter":
            tensors = {f"base_model.model.{k}": v.contiguous() for k, v in version.tensors.items()}
            with atomic_path(d / "adapter_model.safetensors") as tmp:
                save_file(tensors, str(tmp))
            c = self.plan.contract.trainable
            mods = sorted({k.split(".lora_")[0].rsplit(".", 1)[-1] for k in version.tensors})
            write_atomic(d / "adapter_config.json", json.dumps({
                "peft_type": "LORA", "r": c.rank, "lora_alpha": c.alpha or c.rank, "target_modules": mods,
                "lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM"}))
        else:
            with atomic_path(d / "model.safetensors") as tmp:
                save_file({k: v.contiguous() for k, v in version.tensors.items()}, str(tmp))
            config = {k: v for k, v in self.plan.catalog.config.items() if not k.startswith("_")}
            qc = converter_plan(self.plan)["quantization_config"]
            if qc is not None:
                config["quantization_config"] = qc
            write_atomic(d / "config.json", json.dumps(config, indent=1))
        write_atomic(d / "pcc_manifest.json", json.dumps(version.manifest))
        self.installed[version.version] = (version, d)

    def _installed(self, version: int) -> tuple[Version, Path]:
        if version not in self.installed:
            raise EngineError(f"version {version} was never installed")
        return self.installed[version]


def numbers(rows, width: int, what: str, integer: bool = False) -> torch.Tensor:
    """An engine's per-token values (log-probs; token ids with `integer`) checked before torch sees them: a
    list per sequence of exactly `width` finite numbers (integers). A short row, a string, a nested list or
    a NaN is a ValueError (TypeError) saying which sequence and token, which `_reply` turns into an EngineError
    naming the endpoint, instead of a torch error (or a tensor of the wrong shape) further on."""
    if not isinstance(rows, list):
        raise TypeError(f"{what}: {type(rows).__name__} where a list per sequence goes")
    kind = int if integer else (int, float)
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != width:
            got = f"{len(row)} entries" if isinstance(row, list) else type(row).__name__
            raise ValueError(f"{what} of sequence {i}: {got} where {width} go (one per token)")
        for j, x in enumerate(row):
            if isinstance(x, bool) or not isinstance(x, kind) or (not integer and not math.isfinite(x)):
                need = "an integer" if integer else "a finite number"
                raise ValueError(f"{what} of sequence {i}, token {j}: {str(x)[:40]!r} is not {need}")
    return torch.tensor(rows, dtype=torch.long if integer else torch.float64)


def _message(raw: bytes) -> str:
    """The error text of a reply: SGLang's {"message"}, vLLM's ErrorResponse {"error": {"message"}},
    FastAPI's {"detail"}, else the body itself."""
    text = raw.decode(errors="replace")[:300]
    try:
        doc = json.loads(text)
    except ValueError:
        return text
    if not isinstance(doc, dict):
        return text
    err = doc.get("error")
    return str(doc.get("message") or (err.get("message") if isinstance(err, dict) else err) or doc.get("detail")
               or text)


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

