"""The warm start: it stops at a stated held-out quality (so the policy RL starts from does not depend on
where the arithmetic order puts the learning transition), and its cache is keyed by the code that wrote
it and never trusts a damaged file."""

from __future__ import annotations

import warnings

import pytest
import torch
from runtime_helpers import plan

from pcc.runtime import warmstart as W
from pcc.runtime.model import Arch
from pcc.runtime.task import ReverseTask

TINY = {"steps": 2, "batch": 8}  # a fixed-step recipe: enough to exercise the cache, trains in ~0.1 s


@pytest.fixture
def arch():
    return Arch.from_catalog(plan("tiny_cpu", None).catalog)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PCC_CACHE", str(tmp_path))
    return tmp_path / "warmstart"


def test_the_key_covers_inputs_code_and_arithmetic(arch, monkeypatch):
    task, key = ReverseTask(4), W.cache_key(arch, ReverseTask(4), 0, TINY)
    assert W.cache_key(arch, task, 1, TINY) != key
    assert W.cache_key(arch, task, 0, {**TINY, "lr": 1e-3}) != key
    assert W.cache_key(arch, ReverseTask(5), 0, TINY) != key
    assert W.cache_key(arch, task, 0, dict(TINY)) == key  # the same inputs, the same file
    monkeypatch.setattr(W, "code_hash", lambda: "0" * 64)  # older code: a different file, never reused
    assert W.cache_key(arch, task, 0, TINY) != key
    monkeypatch.undo()
    env = W.environment()
    monkeypatch.setattr(W, "environment", lambda: {**env, "threads": env["threads"] + 1})
    assert W.cache_key(arch, task, 0, TINY) != key


def test_code_hash_reads_every_module_it_runs():
    names = {m.__name__ for m in W._CODE}
    assert names == {"pcc.runtime.warmstart", "pcc.runtime.model", "pcc.runtime.hf_model", "pcc.runtime.task",
                     "pcc.runtime.checkpoint"}
    assert len(W.code_hash()) == 64


def _damage(path, where: str) -> None:
    data = bytearray(path.read_bytes())
    if where == "data":
        data[-5] ^= 0xFF  # a flipped bit in the last tensor
    elif where == "header":
        data[12] ^= 0xFF  # inside the JSON header
    elif where == "truncated":
        data = data[: len(data) // 2]
    elif where == "empty":
        data = bytearray()
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["data", "header", "truncated", "empty"])
def test_a_damaged_cache_file_is_rebuilt_not_trusted(arch, cache, where):
    w, cached = W.warm_start(arch, ReverseTask(4), 0, TINY)
    assert not cached
    (path,) = cache.glob("*.safetensors")
    _damage(path, where)
    with pytest.warns(W.CacheWarning, match="rebuilding"):
        again, cached = W.warm_start(arch, ReverseTask(4), 0, TINY)
    assert not cached and all(torch.equal(again[k], w[k]) for k in w)  # rebuilt: the same weights
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rebuilt file is whole
        _, cached = W.warm_start(arch, ReverseTask(4), 0, TINY)
    assert cached


def test_a_file_under_another_key_is_not_used(arch, cache):
    W.warm_start(arch, ReverseTask(4), 0, TINY)
    (path,) = cache.glob("*.safetensors")
    other = cache / f"{W.cache_key(arch, ReverseTask(4), 1, TINY)}.safetensors"
    path.rename(other)  # seed 0's weights where seed 1's belong
    with pytest.warns(W.CacheWarning, match="written for key"):
        _, cached = W.warm_start(arch, ReverseTask(4), 1, TINY)
    assert not cached


def test_the_cache_is_safetensors_with_its_key_and_digest(arch, cache):
    from safetensors import safe_open

    info = {}
    w, _ = W.warm_start(arch, ReverseTask(4), 0, TINY, info=info)
    (path,) = cache.glob("*.safetensors")
    with safe_open(str(path), framework="pt") as f:  # no pickle anywhere
        meta = f.metadata()
    assert meta["key"] == path.stem == info["key"] and meta["sha256"] == W.digest(w)
    assert info["steps"] == 2 and info["env"]["threads"] == torch.get_num_threads()


def test_held_out_prompts_are_never_trained_on():
    task = ReverseTask(4)
    held = W.held_out(task, 128)
    codes = set(W._code(task, held))
    assert len(codes) == 128  # distinct
    batch = W._train_batch(task, 4096, torch.Generator().manual_seed(0), codes)
    assert batch.shape[0] == 4096 and not codes & set(W._code(task, batch))


def test_a_target_no_stream_reaches_fails_loudly(arch, cache):
    recipe = {"steps": 3, "batch": 8, "target": 0.3, "eval_every": 1, "attempts": 2}
    with pytest.raises(W.WarmStartError, match="2 attempt") as err:
        W.warm_start(arch, ReverseTask(4), 0, recipe)
    assert str(W._streams(0, 1)[0]) in str(err.value)  # the second attempt ran from another seed stream
    assert not list(cache.glob("*.safetensors"))  # nothing cached


# The runtime recipe stops within one step of held-out expected exact match 0.3: over seeds 0-5 it landed
# at 0.302-0.331 after 83-205 steps (bench/runtime.py --warm-start), so target + 0.12 is ~4x the largest
# overshoot seen; below the target it never stops (it retries, then fails).
@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_warm_start_quality_does_not_depend_on_the_thread_count(arch, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        info = {}
        w, _ = W.warm_start(arch, ReverseTask(4), 0, None, info=info)
        q = W.quality(arch, w, ReverseTask(4), W.held_out(ReverseTask(4), W.RECIPE["held_out"]))
    finally:
        torch.set_num_threads(before)
    assert info["env"]["threads"] == threads
    assert W.RECIPE["target"] <= q["exact"] <= W.RECIPE["target"] + 0.12, q
    assert q["exact"] == pytest.approx(info["held_out"]["exact"], abs=1e-6)
