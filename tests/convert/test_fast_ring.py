"""pcc.convert.fast._Ring: pieces taken first in, first out never overlap a piece still held, an empty ring
always has room, and a stopped pipeline is not kept waiting."""

import random
import threading

from pcc.convert.fast import _Ring


def test_random_takes_and_gives_never_overlap_a_held_piece():
    ring, rng, held = _Ring(1000, 300, threading.Event()), random.Random(0), []
    sizes = [0, 1, 5, 50, 100, 299, 300, 301, 700, 1000, 1001]
    for _ in range(20000):
        if held and (rng.random() < 0.5 or len(held) > 20):
            held.pop(0)
            ring.give()
            continue
        n = rng.choice(sizes)
        at = ring._place(n) if 0 < n <= 1000 else -1
        if at is None:
            assert held, "an empty ring refused a piece that fits it"
            continue
        view = ring.take(n)
        assert view.nbytes == n
        if at < 0:  # empty, or larger than the ring: a buffer of its own
            assert view.obj is not ring._map
            held.append(None)
            continue
        assert view.obj is ring._map
        assert not any(h and at < h[1] and h[0] < at + n for h in held), (at, n, held)
        held.append((at, at + n))


def test_small_pieces_keep_to_the_first_pages():
    ring = _Ring(1000, 300, threading.Event())
    ends = []
    for _ in range(50):
        ring.take(100)
        if len(ring._live) > 3:
            ring.give()
        ends.append(ring._live[-1][1])
    assert max(ends) <= 400  # past `soft` (300) the next piece goes back to the start once it is free


def test_a_stopped_pipeline_is_not_kept_waiting():
    stop = threading.Event()
    ring = _Ring(100, 50, stop)
    ring.take(80)
    stop.set()
    assert ring.take(80) is None
