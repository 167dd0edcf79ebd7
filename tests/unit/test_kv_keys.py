"""Keys: engine block hashes in a namespace, normalised to 16-byte digests."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from chm.errors import InvalidArgument
from chm.kv.keys import KEY_DTYPE, Namespace, digest_array, keys_from_digests, raw_key


def test_documented_format() -> None:
    ns = Namespace(model="llama-3.1-8b", dtype="bfloat16", tp_rank=1, group=2)
    assert ns.tag() == b"llama-3.1-8b@bfloat16@1@2"
    want = xxhash.xxh3_128_digest(b"chm-kv/1\0llama-3.1-8b@bfloat16@1@2\0" + b"\x0a\x1b")
    assert ns.digest(b"\x0a\x1b") == want
    assert len(want) == 16


def test_bytes_hex_and_int_are_the_same_key() -> None:
    ns = Namespace()
    raw = bytes(range(16))
    d = ns.digest(raw)
    assert ns.digest(raw.hex()) == d
    assert ns.digest("0x" + raw.hex()) == d
    assert ns.digest(int.from_bytes(raw, "big")) == d
    assert ns.digest(bytearray(raw)) == d
    assert ns.digest(memoryview(raw)) == d


@given(st.binary(min_size=1, max_size=64))
def test_namespaces_never_collide(raw: bytes) -> None:
    variants = [
        Namespace(),
        Namespace(model="qwen2.5-32b"),
        Namespace(dtype="float16"),
        Namespace(tp_rank=1),
        Namespace(group=1),
    ]
    assert len({ns.digest(raw) for ns in variants}) == len(variants)


@given(st.lists(st.binary(min_size=1, max_size=32), min_size=0, max_size=40))
def test_key_array_round_trip(raws: list[bytes]) -> None:
    ns = Namespace()
    arr = ns.keys(raws)
    assert arr.dtype == KEY_DTYPE and arr.shape == (len(raws),)
    assert digest_array(arr) == [ns.digest(r) for r in raws]
    assert np.array_equal(keys_from_digests(digest_array(arr)), arr)
    assert ns.keys(arr) is not None and np.array_equal(ns.keys(arr), arr)  # passes through


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ("xyz", "hexadecimal"),
        ("abc", "even length"),
        (b"", "1..64 bytes"),
        (b"x" * 65, "65 bytes"),
        (-1, "[0, 2**128)"),
        (1 << 128, "[0, 2**128)"),
        (True, "not bool"),
        (1.5, "not float"),
        (None, "not NoneType"),
    ],
)
def test_bad_keys_name_the_input(bad: object, words: str) -> None:
    with pytest.raises(InvalidArgument) as ei:
        raw_key(bad)
    assert words in str(ei.value)


def test_one_key_instead_of_a_batch_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="wrap it in a list"):
        Namespace().keys(b"abc")
    with pytest.raises(InvalidArgument, match="KEY_DTYPE"):
        Namespace().keys(np.zeros(3, dtype=np.uint64))


@pytest.mark.parametrize(
    "kwargs",
    [{"model": ""}, {"model": "a@b"}, {"dtype": "x\0"}, {"tp_rank": -1}, {"group": True}],
)
def test_bad_namespace_fields(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument, match="namespace"):
        Namespace(**kwargs)  # type: ignore[arg-type]
