"""The collective weight path's layout (pure): tensors into byte buckets and back."""

from __future__ import annotations

import torch

from rljob.weights.collective import pack, plan_buckets, unpack


def state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"a": torch.randn(10, 3, generator=g),            # 120 B
            "b": torch.randn(7, generator=g).to(torch.bfloat16),  # 14 B
            "c": torch.arange(5, dtype=torch.int64),         # 40 B
            "big": torch.randn(100, generator=g),            # 400 B: over the bucket size
            "empty": torch.zeros(0, 2),
            "d": torch.ones(3, dtype=torch.float16)}


def test_buckets_hold_whole_tensors_aligned_and_under_the_size():
    slots, sizes = plan_buckets(state(), bucket_bytes=256)
    by = {s.name: s for s in slots}
    assert [s.name for s in slots] == list(state())  # order kept
    assert all(s.offset % 16 == 0 for s in slots)
    # a, b, c fit one bucket (0..120, 128..142, 144..184); big gets its own
    assert {by[n].bucket for n in "abc"} == {0} and (by["b"].offset, by["c"].offset) == (128, 144)
    assert by["big"].bucket == 1 and by["big"].offset == 0 and sizes[1] == 400
    assert by["d"].bucket == 2 and by["empty"].bucket == 2
    for i, size in enumerate(sizes):
        inside = [s for s in slots if s.bucket == i]
        assert size == max(s.offset + s.nbytes for s in inside)
        assert size <= 256 or len(inside) == 1


def test_unpack_gives_back_every_tensor_bit_exact_as_views():
    want = state()
    slots, buckets = pack(want, bucket_bytes=256)
    got = unpack(slots, buckets)
    assert list(got) == list(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape
        assert torch.equal(got[name], t), name
    buckets[0].zero_()  # views: the buckets' bytes, no copy
    assert not got["a"].any()
    assert torch.equal(want["a"], state()["a"])  # pack copied: the source is untouched


def test_a_stream_packs_as_planned_holding_one_buckets_tensors_at_a_time():
    """The sender copies a stream of freshly made tensors (a cast, a gathered shard)
    into host buckets as they come: it keeps at most the open bucket's tensors
    alive, and the layout is `plan_buckets`'."""
    import weakref

    want = state()
    alive: list[weakref.ref] = []
    most = 0

    def fresh():
        nonlocal most
        for name, t in want.items():
            most = max(most, sum(r() is not None for r in alive))
            copy = t.clone()
            alive.append(weakref.ref(copy))
            yield name, copy

    slots, buckets = pack(fresh(), bucket_bytes=256)
    assert (slots, [b.numel() for b in buckets]) == plan_buckets(want, bucket_bytes=256)
    assert most <= 3  # a, b, c share the first bucket; the stream never held more
    for name, t in unpack(slots, buckets).items():
        assert torch.equal(t, want[name])
    assert all(r() is None for r in alive)
