"""pcc.convert.shards.ShardWriter's staging ring: spans reserved in order on one thread, filled out of order on
others and committed in order on a third give each shard's bytes and BLAKE3 digest, whatever the spans' sizes
against the ring's slots (wrapping its end, longer than it, batches larger than it); a producer waiting for
the ring's bytes is not kept waiting once the pipeline stops."""

import queue
import random
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from blake3 import blake3

from pcc.convert import shards
from pcc.convert.shards import ShardWriter, plan_shards


def _targets(rng: random.Random, count: int) -> list[tuple[str, str, list[int]]]:
    return [(f"t{k}", "U8", [rng.choice([0, 1, 7, 100, 4096, 5000, 8192, 20000, 70000])]) for k in range(count)]


def _mapped_once(size):
    raise OSError("no second mapping")


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("direct, doubled", [(True, True), (False, True), (True, False), (False, False)])
def test_spans_filled_out_of_order_give_each_shards_bytes(tmp_path, monkeypatch, seed, direct, doubled):
    """Doubled: the ring mapped twice back to back (Linux), a span past its end written in place; else bounced."""
    rng = random.Random(seed)
    monkeypatch.setattr(shards, "STAGE_BYTES", 8192)
    if not direct:
        monkeypatch.setattr(shards, "_open_direct", lambda path: None)
    if not doubled:
        monkeypatch.setattr(shards, "_twice", _mapped_once)
    targets = _targets(rng, 60)
    data = {name: rng.randbytes(shape[0]) for name, _, shape in targets}
    plan = plan_shards(targets, 50000)
    (tmp_path / shards.RECORDS).mkdir()
    writer = ShardWriter(tmp_path, plan, set(), "job")
    handed: queue.Queue = queue.Queue()
    fill, stop, failed = ThreadPoolExecutor(3), threading.Event(), []
    ring, crossed = 8192 * shards.STAGE_COUNT, []

    def commit():
        try:
            while (batch := handed.get()) is not None:
                for span, job in batch:
                    job.result()
                    writer.commit(span)
        except BaseException as err:
            failed.append(err)
            stop.set()

    committer = threading.Thread(target=commit)
    committer.start()
    batch = []
    for name, _, shape in targets:
        pieces = rng.choice([1, 1, 3])
        bounds = sorted({0, shape[0], *(rng.randrange(shape[0] + 1) for _ in range(pieces - 1))})
        for a, b in list(zip(bounds, bounds[1:])) or [(0, 0)]:
            span = writer.reserve(name, b - a, b == shape[0], stop)
            assert span is not None, failed
            if span.start // ring != (span.end - 1) // ring and b - a <= ring:  # (past the ring's end)
                crossed.append(span.bounced)
            job = fill.submit(span.view.__setitem__, slice(None), data[name][a:b])
            batch.append((span, job))
            if rng.random() < 0.3:  # a batch handed on: its spans may be any size, the ring's too
                handed.put(batch)
                writer.hand_off()
                batch = []
    handed.put(batch)
    handed.put(None)
    committer.join()
    assert not failed
    writer.finish()
    for shard in plan:
        got = (tmp_path / shard.file).read_bytes()
        assert got == shard.header + b"".join(data[n] for n in shard.names)
        assert writer.digests[shard.file] == blake3(got).hexdigest()
    assert not list(tmp_path.glob("*.tmp"))
    if sys.platform == "linux":  # (a span's own bytes may still wait for its handing off: bounced either way)
        assert (False in crossed) == doubled and True in crossed


def test_a_producer_waiting_for_the_ring_stops_with_the_pipeline(tmp_path, monkeypatch):
    monkeypatch.setattr(shards, "STAGE_BYTES", 8192)
    def plan(a: int):
        return plan_shards([("a", "U8", [a]), ("b", "U8", [8192])], 1 << 30)

    head = len(plan(40000)[0].header)
    fill = 5 * 8192 - head  # the header and "a" fill the ring's five slots: "b" needs the first again
    assert len(plan(fill)[0].header) == head
    (tmp_path / shards.RECORDS).mkdir()
    writer = ShardWriter(tmp_path, plan(fill), set(), "job")
    stop = threading.Event()
    first = writer.reserve("a", fill, True, stop)
    assert not first.bounced
    writer.hand_off()  # handed on, never committed
    threading.Timer(0.3, stop.set).start()
    assert writer.reserve("b", 8192, True, stop) is None
    writer.abort()


@pytest.mark.parametrize("ahead", [False, True])
def test_empty_tensors_end_a_shard_or_fill_one(tmp_path, monkeypatch, ahead):
    """An empty tensor last in a shard (its shard finished by the bytes before it), and a shard of empty tensors
    only (finished by its header): through `write` (the torch path), and with every span reserved before the
    first is committed (the fast path's producer ahead of its writer)."""
    monkeypatch.setattr(shards, "STAGE_BYTES", 8192)
    targets = [("a", "U8", [100]), ("e1", "U8", [0]), ("b", "U8", [70000]), ("e2", "U8", [0]), ("e3", "U8", [0]),
               ("c", "U8", [70000])]
    plan = plan_shards(targets, 50000)
    assert [s.names for s in plan] == [["a", "e1"], ["b"], ["e2", "e3"], ["c"]]
    (tmp_path / shards.RECORDS).mkdir()
    writer = ShardWriter(tmp_path, plan, set(), "job")
    data = {name: bytes([k + 1]) * shape[0] for k, (name, _, shape) in enumerate(targets)}
    if ahead:
        spans = [writer.reserve(name, len(data[name]), True, threading.Event()) for name, _, _ in targets]
        writer.hand_off()
        for span, (name, _, _) in zip(spans, targets):
            writer.commit(span, data[name])
    else:
        for name, _, _ in targets:
            writer.write(name, data[name])
    writer.finish()
    for shard in plan:
        got = (tmp_path / shard.file).read_bytes()
        assert got == shard.header + b"".join(data[n] for n in shard.names)
        assert writer.digests[shard.file] == blake3(got).hexdigest()


def test_a_tensor_of_another_size_than_its_header_is_an_error_where_it_ends(tmp_path):
    from pcc.convert import ConvertError

    plan = plan_shards([("a", "U8", [100]), ("b", "U8", [10])], 1 << 20)
    (tmp_path / shards.RECORDS).mkdir()
    writer = ShardWriter(tmp_path, plan, set(), "job")
    writer.reserve("a", 60, False)
    with pytest.raises(ConvertError, match="a ends at byte .*its header says"):
        writer.reserve("a", 39, True)
    writer.abort()


@pytest.mark.skipif(sys.platform != "linux", reason="mincore and MADV_REMOVE are Linux's")
@pytest.mark.parametrize("doubled", [True, False])
def test_the_rings_pages_are_given_back_as_its_last_uses_are_written(tmp_path, monkeypatch, doubled):
    """A slot whose pages stage no later byte of the stream is freed once written and hashed, not when the ring
    is unmapped after the last write: none of the ring's pages is resident once the writer finishes, and every
    byte reached the file (a slot freed too soon would have written zeros)."""
    import ctypes
    import mmap

    monkeypatch.setattr(shards, "STAGE_BYTES", 2 * mmap.PAGESIZE)
    if not doubled:
        monkeypatch.setattr(shards, "_twice", _mapped_once)
    size = 23 * mmap.PAGESIZE + 100  # the ring's five slots used twice, and more
    plan = plan_shards([("a", "U8", [size]), ("b", "U8", [size // 3])], 1 << 30)
    (tmp_path / shards.RECORDS).mkdir()
    writer = ShardWriter(tmp_path, plan, set(), "job")
    data = {"a": random.Random(0).randbytes(size), "b": random.Random(1).randbytes(size // 3)}
    for name in ("a", "b"):
        writer.write(name, data[name])
    writer.finish()
    assert (tmp_path / plan[0].file).read_bytes() == plan[0].header + data["a"] + data["b"]
    ring = writer._ring[:shards.STAGE_BYTES * shards.STAGE_COUNT]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    vec = ctypes.create_string_buffer(ring.nbytes // mmap.PAGESIZE)
    assert libc.mincore(shards.buffer_address(ring), ring.nbytes, vec) == 0, ctypes.get_errno()
    assert sum(b & 1 for b in vec.raw) == 0
