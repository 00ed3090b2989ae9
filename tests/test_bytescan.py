import pytest

from ext_proc import bytescan

PROSE = ("Résumé, naïve: 12,345 ids [1,2,3] {x: 0}\n" * 2000).encode()


@pytest.mark.parametrize("raw", [b"", b",", PROSE[:100], PROSE])
@pytest.mark.parametrize("start", [0, 1, 50, 70_000])
def test_count_is_bytes_count_at_every_size(raw, start):
    for byte in b",0x\n":
        assert bytescan.count(raw, byte, start) == raw.count(byte, start)


@pytest.mark.parametrize("needle", [b",", b"ids [", b"{x: 0}\nR", b"absent"])
@pytest.mark.parametrize("start", [0, 7, len(PROSE) - 3])
def test_find_is_bytes_find(needle, start):
    assert bytescan.find(PROSE, needle, start) == PROSE.find(needle, start)


def test_translate_is_bytes_translate_also_of_a_view():
    table = bytes((i + 1) % 256 for i in range(256))
    assert bytescan.translate(PROSE, table) == PROSE.translate(table)
    assert bytescan.translate(memoryview(PROSE)[3:-3], table) == PROSE[3:-3].translate(table)
