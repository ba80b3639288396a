"""Hostile checkpoints, destinations and bundles (issue "Hostile input and faults"): each refused with
one clear, coded line, nothing read from or written to a place it does not belong."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
from convert_helpers import make_checkpoint, write_contract
from safetensors.torch import save_file

from pcc.cli import main

SHARD = "model-00002-of-00002.safetensors"


@pytest.fixture
def moe(tmp_path):
    src = tmp_path / "src"
    make_checkpoint(src, "tiny_moe")
    return src, write_contract(tmp_path, "fp8_block")


def _json(capsys, argv):
    code = main([*argv, "--json"])
    env = json.loads(capsys.readouterr().out)
    return code, env["diagnostics"]


def _convert(capsys, src, contract, dst, *extra):
    return _json(capsys, ["convert", str(contract), "--from", str(src), "--to", str(dst), *extra])


def _edit_header(path, edit, data=None):
    """Rewrite a safetensors file's header with `edit(header)`; `data(bytes)` may change the data too."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    edit(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    body = raw[8 + n:]
    path.write_bytes(len(text).to_bytes(8, "little") + text + (data(body) if data else body))


def _expert(header, j, name="down_proj"):
    return next(k for k in header if f"experts.{j}.{name}" in k)


def _alias(header):
    # expert 1's down_proj declared at expert 0's bytes: same size, so only the offsets give it away
    a, b = _expert(header, 0), _expert(header, 1)
    header[b]["data_offsets"] = list(header[a]["data_offsets"])


def _negative(header):
    name = _expert(header, 2)
    begin, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [begin - end - 8, -8]


def _gap(header):
    for k, v in header.items():
        if k != "__metadata__":
            v["data_offsets"] = [v["data_offsets"][0] + 16, v["data_offsets"][1] + 16]


def _past_the_file(header):
    end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    header["model.layers.9.extra"] = {"dtype": "F32", "shape": [4], "data_offsets": [end, end + 16]}


@pytest.mark.parametrize("edit,data,words", [
    (_alias, None, r"experts\.[01]\.down_proj\.weight.*overlap"),
    (_negative, None, r"0 <= begin <= end"),
    (_gap, lambda body: bytes(16) + body, r"gap"),
    (_past_the_file, None, r"truncated: tensor model\.layers\.9\.extra ends at byte"),
    (lambda h: None, lambda body: body + bytes(24), r"24 bytes after the last tensor"),
    (lambda h: h[_expert(h, 0)].update(dtype="F4"), None, r"dtype 'F4'"),
], ids=["overlap", "negative", "gap", "past-the-file", "trailing-bytes", "unknown-dtype"])
def test_corrupt_source_header_is_refused(moe, tmp_path, capsys, edit, data, words):
    src, contract = moe
    _edit_header(src / SHARD, edit, data)
    code, diags = _convert(capsys, src, contract, tmp_path / "dst")
    assert code == 1 and not (tmp_path / "dst").exists()
    assert len(diags) == 1 and diags[0]["code"] == "PCC710", diags
    assert SHARD in diags[0]["message"] and re.search(words, diags[0]["message"]), diags


def test_verify_refuses_an_output_whose_experts_alias(moe, tmp_path, capsys):
    """A converted checkpoint whose header is then edited so two experts share bytes fails verify
    (before, it passed `--full`: one expert's codes read as another's)."""
    src, contract = moe
    dst = tmp_path / "dst"
    assert _convert(capsys, src, contract, dst)[0] == 0

    def alias_codes(header):
        a, b = _expert(header, 0, "down_proj.weight"), _expert(header, 1, "down_proj.weight")
        header[b]["data_offsets"] = list(header[a]["data_offsets"])

    _edit_header(dst / "model.safetensors", alias_codes)
    code, diags = _json(capsys, ["verify-checkpoint", str(contract), str(dst), "--source", str(src), "--full"])
    assert code == 1 and diags[0]["code"] == "PCC710" and "overlap" in diags[0]["message"]


def test_verify_checks_recorded_shard_hashes_without_full(moe, tmp_path, capsys):
    src, contract = moe
    dst = tmp_path / "dst"
    assert _convert(capsys, src, contract, dst, "--max-shard-size", "400KB")[0] == 0
    record = json.loads((dst / "pcc_convert.json").read_text())["shards"]
    assert len(record) > 2
    assert _json(capsys, ["verify-checkpoint", str(contract), str(dst)])[0] == 0
    # one code byte of a tensor the sampled value check does not read: only the recorded hash sees it
    shard = sorted(record)[-2]
    raw = bytearray((dst / shard).read_bytes())
    raw[-3] ^= 0x01
    (dst / shard).write_bytes(bytes(raw))
    code, diags = _json(capsys, ["verify-checkpoint", str(contract), str(dst)])
    assert code == 1
    assert [d["code"] for d in diags if d["severity"] == "error"] == ["PCC712"], diags
    assert shard in diags[0]["message"] and "blake3 digest differs" in diags[0]["message"]


def test_shard_digests_are_blake3_and_older_sha256_records_still_verify(moe, tmp_path, capsys):
    """The record is the BLAKE3 of each whole file (checked with hashlib's independent SHA-256 for the
    older form): a record without `shard_hash` is SHA-256, as pcc wrote before; an unknown one is PCC712."""
    import hashlib

    from blake3 import blake3

    src, contract = moe
    dst = tmp_path / "dst"
    assert _convert(capsys, src, contract, dst, "--max-shard-size", "400KB")[0] == 0
    mark = dst / "pcc_convert.json"
    doc = json.loads(mark.read_text())
    assert doc["shard_hash"] == "blake3"
    assert doc["shards"] == {f: blake3((dst / f).read_bytes()).hexdigest() for f in doc["shards"]}
    older = {k: v for k, v in doc.items() if k != "shard_hash"}
    older["shards"] = {f: hashlib.sha256((dst / f).read_bytes()).hexdigest() for f in doc["shards"]}
    mark.write_text(json.dumps(older))
    assert _json(capsys, ["verify-checkpoint", str(contract), str(dst)])[0] == 0
    shard = sorted(doc["shards"])[0]
    raw = bytearray((dst / shard).read_bytes())
    raw[-1] ^= 0x01
    (dst / shard).write_bytes(bytes(raw))
    code, diags = _json(capsys, ["verify-checkpoint", str(contract), str(dst)])
    assert code == 1 and "sha256 digest differs" in diags[0]["message"] and shard in diags[0]["message"]
    mark.write_text(json.dumps(doc | {"shard_hash": "md5"}))
    code, diags = _json(capsys, ["verify-checkpoint", str(contract), str(dst)])
    assert code == 1 and diags[0]["code"] == "PCC712" and "unknown shard hash 'md5'" in diags[0]["message"]


def test_verify_without_a_record_says_hashes_were_not_checked(moe, tmp_path, capsys):
    src, contract = moe
    dst = tmp_path / "dst"
    assert _convert(capsys, src, contract, dst)[0] == 0
    (dst / "pcc_convert.json").unlink()
    code, diags = _json(capsys, ["verify-checkpoint", str(contract), str(dst)])
    assert code == 0 and any("shard hashes not checked" in d["message"] for d in diags), diags


def test_force_replaces_only_pccs_own_checkpoint(moe, tmp_path, capsys):
    src, contract = moe
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "notes.txt").write_text("mine")
    code, diags = _convert(capsys, src, contract, dst, "--force")
    assert code == 1 and diags[0]["code"] == "PCC711" and "not a pcc rollout checkpoint" in diags[0]["message"]
    assert (dst / "notes.txt").read_text() == "mine" and len(list(dst.iterdir())) == 1
    (dst / "notes.txt").unlink()  # an empty directory is no one's work: written without --force
    assert _convert(capsys, src, contract, dst)[0] == 0
    assert _convert(capsys, src, contract, dst)[1][0]["code"] == "PCC711"  # exists: needs --force
    assert _convert(capsys, src, contract, dst, "--force")[0] == 0  # pcc's own output: replaced
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, diags = _convert(capsys, src, contract, afile, "--force")
    assert code == 1 and "not a directory" in diags[0]["message"] and afile.read_text() == "x"


ADAPTER_CONTRACT = """contract lora-tiny {
  model tiny_dense
  hardware H100
  rollout sglang { linear : fp8_block }
  trainer megatron { gemm : bf16 optimizer adam }
  trainable lora rank 8 alpha 16 targets attn.q
  sync adapter { schedule colocated activation atomic }
}
"""


def _lora(path):
    tensors = {}
    for layer in range(4):
        m = f"model.layers.{layer}.self_attn.q_proj"
        tensors[m + ".lora_A.weight"] = torch.randn(8, 128).to(torch.bfloat16)
        tensors[m + ".lora_B.weight"] = torch.randn(128, 8).to(torch.bfloat16)
    save_file(tensors, str(path))


def test_adapter_force_and_corrupt_adapter(tmp_path, capsys):
    contract = tmp_path / "c.prec"
    contract.write_text(ADAPTER_CONTRACT)
    src = tmp_path / "adapter.safetensors"
    _lora(src)
    dst = tmp_path / "peft"
    dst.mkdir()
    (dst / "train.log").write_text("keep")
    argv = ["convert", str(contract), "--adapter", str(src), "--to", str(dst)]
    code, diags = _json(capsys, [*argv, "--force"])
    assert code == 1 and diags[0]["code"] == "PCC711" and (dst / "train.log").read_text() == "keep"
    (dst / "train.log").unlink()
    assert _json(capsys, argv)[0] == 0
    assert _json(capsys, [*argv, "--force"])[0] == 0  # its own export: replaced
    src.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    code, diags = _json(capsys, [*argv, "--force"])
    assert code == 1 and diags[0]["code"] == "PCC713" and "unreadable adapter" in diags[0]["message"], diags
    assert str(src) in diags[0]["message"]


def test_side_files_linked_from_outside_are_refused(moe, tmp_path, capsys):
    src, contract = moe
    secret = tmp_path / "secret.txt"
    secret.write_text("not part of the model")
    (src / "tokenizer_config.json").symlink_to(secret)
    code, diags = _convert(capsys, src, contract, tmp_path / "dst")
    assert code == 1 and diags[0]["code"] == "PCC714" and "outside the checkpoint directory" in diags[0]["message"]
    assert not (tmp_path / "dst").exists()
    # a link to a file inside the checkpoint is copied (as its content)
    (src / "tokenizer_config.json").unlink()
    (src / "sub").mkdir()
    (src / "sub" / "tok.json").write_text('{"model_max_length": 128}')
    (src / "tokenizer_config.json").symlink_to(src / "sub" / "tok.json")
    assert _convert(capsys, src, contract, tmp_path / "dst")[0] == 0
    out = tmp_path / "dst" / "tokenizer_config.json"
    assert not out.is_symlink() and out.read_text() == '{"model_max_length": 128}'


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json"])
def test_a_config_or_index_linked_from_outside_is_refused_by_a_bundle_too(moe, tmp_path, capsys, name):
    """A bundle's converter plan runs without compiling (which refuses the link, PCC211): the source is checked
    as it is opened. (Found by a review of the kept converter plans.)"""
    src, contract = moe
    assert main(["compile", str(contract), "-o", str(tmp_path / "bundle")]) == 0
    capsys.readouterr()
    elsewhere = tmp_path / f"elsewhere-{name}"
    os.replace(src / name, elsewhere)
    (src / name).symlink_to(elsewhere)
    code, diags = _convert(capsys, src, tmp_path / "bundle", tmp_path / "dst")
    assert code == 1 and diags[0]["code"] == "PCC714" and "outside the checkpoint directory" in diags[0]["message"]
    assert not (tmp_path / "dst").exists()


def test_index_naming_a_shard_outside_is_refused(moe, tmp_path, capsys):
    src, contract = moe
    other = tmp_path / "other"
    other.mkdir()
    os.replace(src / SHARD, other / SHARD)
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: (f"../other/{SHARD}" if v == SHARD else v) for k, v in index["weight_map"].items()}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    code, diags = _convert(capsys, src, contract, tmp_path / "dst")
    assert code == 1 and diags[0]["code"] == "PCC714" and "not a file name in the checkpoint" in diags[0]["message"]
    (src / SHARD).symlink_to(other / SHARD)  # a link out of the directory is refused as well
    index["weight_map"] = {k: (SHARD if v.startswith("../") else v) for k, v in index["weight_map"].items()}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    code, diags = _convert(capsys, src, contract, tmp_path / "dst")
    assert code == 1 and diags[0]["code"] == "PCC714" and "links to" in diags[0]["message"]


def test_index_naming_a_shard_that_is_no_safetensors_file_is_refused(moe, tmp_path, capsys):
    """The compile's rule (PCC211), now that a conversion's catalog is the opened source's: a shard the index names
    `shard0.st` is neither read nor copied into the output as a side file (found by a review)."""
    src, contract = moe
    os.replace(src / SHARD, src / "shard0.st")
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: ("shard0.st" if v == SHARD else v) for k, v in index["weight_map"].items()}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    code, diags = _convert(capsys, src, contract, tmp_path / "dst")
    assert code == 1 and diags[0]["code"] == "PCC211" and "'shard0.st'" in diags[0]["message"], diags
    assert not (tmp_path / "dst").exists()


def test_bundle_checked_against_its_manifest(moe, tmp_path, capsys):
    """`pcc convert BUNDLE` and `verify-checkpoint BUNDLE` read the bundle through pcc.bundle.read_bundle:
    an edited contract.prec (fp8_block -> int4) converts nothing and verifies nothing."""
    src, contract = moe
    bundle = tmp_path / "bundle"
    assert main(["compile", str(contract), "-o", str(bundle)]) == 0
    capsys.readouterr()
    dst = tmp_path / "dst"
    assert _convert(capsys, src, bundle, dst)[0] == 0
    text = (bundle / "contract.prec").read_text()
    (bundle / "contract.prec").write_text(text.replace("linear : fp8_block", "linear : int4_g32"))
    code, diags = _convert(capsys, src, bundle, tmp_path / "dst2")
    assert code == 1 and diags[0]["code"] == "PCC706" and not (tmp_path / "dst2").exists()
    code, diags = _json(capsys, ["verify-checkpoint", str(bundle), str(dst)])
    assert code == 1 and diags[0]["code"] == "PCC706" and "contract.prec" in diags[0]["message"]


def _truncated(path):
    path.write_text(path.read_text()[:-7])


def _fifo(path):
    path.unlink()
    os.mkfifo(path)


def _huge(path):
    with path.open("r+b") as fh:  # sparse: over the limit by its stated size, nothing read
        fh.truncate(65 << 20)


HOSTILE = pytest.mark.parametrize("spoil,words", [
    (_truncated, "not valid JSON"), (_fifo, "a FIFO, not a regular file"), (_huge, r"over the \d+ MiB limit")],
    ids=["truncated", "fifo", "huge"])


@HOSTILE
@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json"])
def test_a_hostile_source_json_is_a_coded_refusal(moe, tmp_path, capsys, spoil, words, name):
    """The checkpoint's config and index go through pcc's one bounded reader (pcc.lang.inputs): a FIFO
    never hangs the conversion and a huge file is never read; each is one PCC702 line, no traceback."""
    src, contract = moe
    spoil(src / name)
    code, diags = _convert(capsys, src, contract, tmp_path / "dst")
    assert code == 1 and not (tmp_path / "dst").exists()
    assert len(diags) == 1 and diags[0]["code"] == "PCC702" and name in diags[0]["message"], diags
    assert re.search(words, diags[0]["message"]) and "Traceback" not in capsys.readouterr().err


@HOSTILE
def test_a_hostile_conversion_record_fails_verify(moe, tmp_path, capsys, spoil, words):
    src, contract = moe
    dst = tmp_path / "dst"
    assert _convert(capsys, src, contract, dst)[0] == 0
    spoil(dst / "pcc_convert.json")
    code, diags = _json(capsys, ["verify-checkpoint", str(contract), str(dst)])
    assert code == 1 and [d["code"] for d in diags if d["severity"] == "error"] == ["PCC712"], diags
    assert "unreadable record of the shards" in diags[0]["message"] and re.search(words, diags[0]["message"])


@HOSTILE
def test_a_hostile_shard_record_is_redone_on_resume_or_refused(tmp_path, spoil, words):
    """--resume trusts a shard only on a record it can read (else it writes the shard again); a record
    that turns hostile after that is a coded refusal, not a traceback."""
    from pcc.convert import ConvertError
    from pcc.convert.run import _recorded
    from pcc.convert.shards import RECORDS, Shard, complete

    shard = Shard("model.safetensors", [], b"", 8)
    (tmp_path / shard.file).write_bytes(bytes(8))
    (tmp_path / RECORDS).mkdir()
    (tmp_path / shard.record).write_text(json.dumps({"job": "j", "blake3": "0" * 64, "file": shard.file}))
    spoil(tmp_path / shard.record)
    assert not complete(tmp_path, shard, "j")
    with pytest.raises(ConvertError, match=words) as err:
        _recorded(tmp_path, shard)
    assert err.value.code == "PCC702"
