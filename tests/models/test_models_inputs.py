"""Bad model directories (issue 14's model-input cases): each is one coded CatalogError naming the file and
field, never a traceback, and nothing outside the checkpoint directory is read. `pcc check` on a contract
naming such a directory exits 1 with one diagnostic."""

import json
import os

import pytest
import torch
from test_models_checkpoint import INDEX, tensors_for, write_checkpoint

from pcc.cli import main
from pcc.models import CatalogError, catalog_from_checkpoint, load_catalog


def _config_only(tmp_path, **changes):
    tmp_path.mkdir(exist_ok=True)
    config = dict(load_catalog("tiny_dense").config, **changes)
    for key, value in changes.items():
        if value is None:
            del config[key]
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def _code(path) -> tuple[str, str]:
    with pytest.raises(CatalogError) as info:
        catalog_from_checkpoint(path)
    return info.value.code, str(info.value)


@pytest.mark.parametrize("changes, field", [
    ({"num_hidden_layers": None}, "no num_hidden_layers"),
    ({"hidden_size": "64"}, "hidden_size is '64'"),
    ({"num_attention_heads": True}, "num_attention_heads is True"),
    ({"intermediate_size": 128.0}, "intermediate_size is 128.0"),
    ({"vocab_size": -1}, "vocab_size is -1"),
    ({"torch_dtype": ["bfloat16"]}, "torch_dtype is ['bfloat16']"),
    ({"torch_dtype": "float64"}, "torch_dtype is 'float64'"),
    ({"num_hidden_layers": 0}, "num_hidden_layers is 0"),
])
def test_config_that_pcc_would_misread_is_pcc209(tmp_path, changes, field):
    code, message = _code(_config_only(tmp_path, **changes))
    assert code == "PCC209" and field in message and "config.json" in message


def test_text_config_without_layer_count_names_the_nested_field(tmp_path):
    inner = {k: v for k, v in load_catalog("tiny_dense").config.items() if k != "num_hidden_layers"}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava", "text_config": inner}))
    code, message = _code(tmp_path)
    assert code == "PCC209" and "text_config.num_hidden_layers" in message


def _shards(tmp_path):
    built = load_catalog("tiny_dense")
    return write_checkpoint(tmp_path / "ckpt", built.config, tensors_for(built))


@pytest.mark.parametrize("value", [3, ["model-00001-of-00002.safetensors"], None, {"file": "x"}])
def test_index_value_that_is_not_a_file_name_is_pcc210(tmp_path, value):
    root = _shards(tmp_path)
    index = json.loads((root / INDEX).read_text())
    index["weight_map"]["model.norm.weight"] = value
    (root / INDEX).write_text(json.dumps(index))
    code, message = _code(root)
    assert code == "PCC210" and "weight_map['model.norm.weight']" in message


def test_index_without_weight_map_object_is_pcc210(tmp_path):
    root = _shards(tmp_path)
    (root / INDEX).write_text(json.dumps({"weight_map": ["a", "b"]}))
    assert _code(root)[0] == "PCC210"


def test_header_dtype_pcc_does_not_know_is_pcc210(tmp_path):
    root = _shards(tmp_path)
    shard = sorted(root.glob("*.safetensors"))[0]
    raw = shard.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = raw[8:8 + length].replace(b'"BF16"', b'"F4"  ', 1)  # same length: FP4, a dtype pcc does not read
    shard.write_bytes(raw[:8] + header + raw[8 + length:])
    code, message = _code(root)
    assert code == "PCC210" and "'F4'" in message and shard.name in message


@pytest.mark.parametrize("target", ["../outside.safetensors", "/etc/passwd", "sub/../../x.safetensors", "config.json"])
def test_index_pointing_outside_the_directory_is_pcc211_and_nothing_is_read(tmp_path, target):
    root = _shards(tmp_path)
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes(b"\xff" * 16)  # unreadable as safetensors: reading it would be a different error
    index = json.loads((root / INDEX).read_text())
    index["weight_map"]["model.norm.weight"] = target
    (root / INDEX).write_text(json.dumps(index))
    code, message = _code(root)
    assert code == "PCC211" and repr(target) in message


def test_symlinked_shard_pointing_outside_is_pcc211(tmp_path):
    root = _shards(tmp_path)
    shard = sorted(root.glob("*.safetensors"))[0]
    elsewhere = tmp_path / "elsewhere.safetensors"
    shard.rename(elsewhere)
    shard.symlink_to(elsewhere)
    code, message = _code(root)
    assert code == "PCC211" and "symbolic link" in message and str(elsewhere) in message


def test_symlinked_config_pointing_outside_is_pcc211(tmp_path):
    root = _config_only(tmp_path / "m")
    real = tmp_path / "other.json"
    (root / "config.json").rename(real)
    (root / "config.json").symlink_to(real)
    assert _code(root)[0] == "PCC211"


def test_hub_cache_snapshot_links_into_its_own_blobs(tmp_path):
    """A Hugging Face hub cache: snapshots/REV/* link to ../../blobs/HASH; that is the model's own place."""
    built = load_catalog("tiny_dense")
    repo = tmp_path / "models--org--tiny"
    flat = write_checkpoint(tmp_path / "flat", built.config, tensors_for(built))
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted(flat.iterdir())):
        blob = repo / "blobs" / f"blob{i}"
        f.rename(blob)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    assert catalog_from_checkpoint(snap).operators == built.operators


def test_fifo_shard_is_refused_without_blocking(tmp_path):
    root = _shards(tmp_path)
    shard = sorted(root.glob("*.safetensors"))[0]
    shard.unlink()
    os.mkfifo(shard)
    code, message = _code(root)
    assert code == "PCC210" and "not a regular file" in message


def test_pcc_check_reports_one_diagnostic_not_a_traceback(tmp_path, capsys):
    model = _config_only(tmp_path / "m", hidden_size="64")
    contract = tmp_path / "c.prec"
    contract.write_text(f'contract c {{\n  model from "{model}"\n  hardware cpu\n}}\n', encoding="utf-8")
    assert main(["check", str(contract)]) == 1
    err = capsys.readouterr()
    assert "hidden_size is '64'" in err.out + err.err and "Traceback" not in err.out + err.err


def test_packed_weight_without_scales_is_pcc208_and_says_packing(tmp_path):
    """A ModelOpt NVFP4 shard whose scales were dropped: U8 [N, K/2] is the packed weight, not a bad config."""
    built = load_catalog("tiny_dense")
    tensors = tensors_for(built)
    name = "model.layers.0.mlp.down_proj.weight"
    n, k = tensors[name].shape
    tensors[name] = torch.zeros(n, k // 2, dtype=torch.uint8)
    code, message = _code(write_checkpoint(tmp_path / "ckpt", built.config, tensors))
    assert code == "PCC208" and f"[{n}, {k // 2}]" in message and f"[{n}, {k}]" in message
    assert "packed" in message and "two E2M1 (FP4) codes per byte" in message


def test_a_shape_that_is_simply_wrong_does_not_mention_packing(tmp_path):
    built = load_catalog("tiny_dense")
    tensors = tensors_for(built)
    name = "model.layers.0.mlp.down_proj.weight"
    n, k = tensors[name].shape
    tensors[name] = torch.zeros(n, k // 2, dtype=torch.bfloat16)
    code, message = _code(write_checkpoint(tmp_path / "ckpt", built.config, tensors))
    assert code == "PCC204" and "packed" not in message


def _rewrite_header(shard, edit) -> None:
    """Rewrite one shard's JSON header through `edit(header)`, keeping its data bytes."""
    raw = shard.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + length])
    edit(header)
    new = json.dumps(header).encode()
    shard.write_bytes(len(new).to_bytes(8, "little") + new + raw[8 + length:])


def _two_tensors(header) -> tuple[str, str]:
    names = sorted((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"][0])
    return names[0], names[1]


def test_overlapping_offsets_are_pcc210(tmp_path):
    """One expert's bytes read as another's converted 'ok' before (issue 14): the tiling is checked."""
    root = _shards(tmp_path)
    shard = sorted(root.glob("*.safetensors"))[0]

    def overlap(header):
        a, b = _two_tensors(header)
        begin, end = header[b]["data_offsets"]
        header[b]["data_offsets"] = [begin - 2, end - 2]

    _rewrite_header(shard, overlap)
    code, message = _code(root)
    assert code == "PCC210" and "overlaps" in message and shard.name in message


def test_offsets_that_disagree_with_dtype_and_shape_are_pcc210(tmp_path):
    root = _shards(tmp_path)
    shard = sorted(root.glob("*.safetensors"))[0]

    def grow(header):
        a, _ = _two_tensors(header)
        header[a]["shape"] = [header[a]["shape"][0] * 2, *header[a]["shape"][1:]]

    _rewrite_header(shard, grow)
    code, message = _code(root)
    assert code == "PCC210" and "the header is corrupt" in message


def test_negative_offsets_are_pcc210(tmp_path):
    root = _shards(tmp_path)
    shard = sorted(root.glob("*.safetensors"))[0]
    _rewrite_header(shard, lambda h: h[_two_tensors(h)[0]].update(data_offsets=[-4, 0]))
    assert _code(root)[0] == "PCC210"


@pytest.mark.parametrize("qc", [
    {"quant_method": "fp8", "weight_block_size": ["128", "x"]},
    {"quant_method": "fp8", "weight_block_size": 128},
    {"quant_method": "modelopt", "quantization": "NVFP4"},
    {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": ["group_0"]},
])
def test_malformed_quantization_config_is_pcc208(tmp_path, qc):
    built = load_catalog("tiny_dense")
    tensors = tensors_for(built)
    name = "model.layers.0.mlp.down_proj"
    n, k = tensors[name + ".weight"].shape
    if qc["quant_method"] == "fp8":
        tensors[name + ".weight"] = torch.zeros(n, k, dtype=torch.float8_e4m3fn)
        tensors[name + ".weight_scale_inv"] = torch.ones(1, 1)
    elif qc["quant_method"] == "compressed-tensors":
        del tensors[name + ".weight"]
        tensors.update({name + ".weight_packed": torch.zeros(n, k // 8, dtype=torch.int32),
                        name + ".weight_scale": torch.ones(n, 1), name + ".weight_shape": torch.tensor([n, k])})
    code, message = _code(write_checkpoint(tmp_path / "q", dict(built.config, quantization_config=qc), tensors))
    assert code == "PCC208" and "config.json" in message
