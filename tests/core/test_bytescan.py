import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ext_proc.core import bytescan

PROSE = ("Résumé, naïve: 12,345 ids [1,2,3] {x: 0}\n" * 2000).encode()


@pytest.mark.parametrize("raw", [b"", b",", PROSE[:100], PROSE])
@pytest.mark.parametrize("start", [0, 1, 50, 70_000])
def test_count_is_bytes_count_at_every_size(raw, start):
    for byte in b",0x\n":
        assert bytescan.count(raw, byte, start) == raw.count(byte, start)


@pytest.mark.parametrize("needle", [b",", b"]", b"~", b"ids [", b"{x: 0}\nR", b"absent"])
@pytest.mark.parametrize("start", [0, 7, len(PROSE) - 3])
def test_find_is_bytes_find(needle, start):
    assert bytescan.find(PROSE, needle, start) == PROSE.find(needle, start)


def test_translate_is_bytes_translate_also_of_a_view():
    table = bytes((i + 1) % 256 for i in range(256))
    assert bytescan.translate(PROSE, table) == PROSE.translate(table)
    assert bytescan.translate(memoryview(PROSE)[3:-3], table) == PROSE[3:-3].translate(table)


@pytest.mark.parametrize("size", [40, 1 << 15])
@pytest.mark.parametrize("length", [15, 19])
def test_a_run_is_found_wherever_it_lies_against_the_words(size, length):
    # Short numbers everywhere (no eight digits in a row), and one run at each offset
    # against the 8-byte words: at the start, in the middle, flush with the end.
    filler = (b"1234567," * size)[:size]
    for at in [*range(17), size // 2, size // 2 + 5, size - length]:
        for run_length in (length - 1, length, length + 3):
            if at + run_length > size:
                continue
            raw = filler[:at] + b"0" * run_length + filler[at + run_length :]
            assert bytescan.has_run(raw, ord("0"), length) is (b"0" * length in raw)


def test_runs_too_short_to_cover_a_word_are_refused():
    with pytest.raises(ValueError, match="no whole word"):
        bytescan.has_run(b"", ord("0"), 14)


@pytest.mark.parametrize("most", [0, 1, 2, 5])
@pytest.mark.parametrize(
    "raw", [b"", b"ab", b"abab", b"aaaa", b"xabyabzab", b"ab" * 1000, b"x" * 20000 + b"ab"]
)
@pytest.mark.parametrize("needle", [b"ab", b"aa"])
def test_occurrences_is_count_capped(raw, needle, most):
    assert bytescan.occurrences(raw, needle, most) == min(raw.count(needle), most)


QUOTE_NAMES = (b"abc", b"tokens", b"kv_transfer_params")


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"abc": 1, "tokens": [1]}', {b"abc": 1, b"tokens": 1}),
        (b'{"max_tokens": 1, "tokens_2": 1, "Tokens": 1}', {}),
        (b'"abc"abc"abc"', {b"abc": 2}),  # each quote that begins "abc", to most
        (b'"x"abc"', {b"abc": 1}),  # a closing quote begins the next run too
        (b'"ab\\"abc"', {b"abc": 1}),
        (b'"abc', {}),
        (b'{"kv_transfer_params": {"kv_transfer_params": 1}}', {b"kv_transfer_params": 2}),
    ],
)
@pytest.mark.parametrize("size", [0, 1 << 18])
def test_quoted_counts_each_quote_that_begins_a_name(raw, expected, size, compiled, monkeypatch):
    if not compiled:
        monkeypatch.setattr(bytescan, "COMPILED", None)
    else:
        assert bytescan.COMPILED is not None, "ext_proc.core._scan is not built (make)"
    body = b" " * size + raw + b" " * size
    assert bytescan.quoted(body, QUOTE_NAMES, 2) == expected


@pytest.mark.parametrize("length", [15, 18, 19, 23, 40])
def test_a_run_is_found_among_many_words_of_the_byte(length):
    # Whole words of the byte everywhere (runs of 8 to 14), each with a different
    # reach into its neighbours; one longer run at each offset, and at either end.
    size = 1 << 15
    filler = b"".join(b"1" * (i % 7) + b"0" * (8 + i % 7) + b"," for i in range(size // 8))[:size]
    assert bytescan.has_run(filler, ord("0"), 15) is False
    for at in [0, 1, 7, 8, 9, 4097, size // 2 + 3, size - length - 1, size - length]:
        for run_length in (length - 1, length):
            raw = filler[:at] + b"0" * run_length + filler[at + run_length :]
            raw = raw[:size]
            assert bytescan.has_run(raw, ord("0"), length) is (b"0" * length in raw), at


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 30), st.sampled_from(b"01,\xb0")), max_size=3000),
    st.integers(15, 24),
    st.integers(0, 7),
)
def test_has_run_is_a_search_for_the_run(parts, length, tail):
    raw = b"".join(bytes([byte]) * n for n, byte in parts)
    raw = (raw + b"0" * tail) if len(raw) >= bytescan._VECTOR_MIN else raw * 8 + b"0" * tail
    assert bytescan.has_run(raw, ord("0"), length) is (b"0" * length in raw)
