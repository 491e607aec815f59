"""SPEC.md §9: the xz limit is on the LZMA2 dictionary size the stream declares, not on liblzma's accounting."""
from __future__ import annotations

import lzma

import pytest

from arcfmt import codecs
from arcfmt.errors import CorruptError, LimitError
from arcfmt.layout import MAX_XZ_MEMORY
from support.records import xz_with_dictionary_code

_xz_with_dictionary_code = xz_with_dictionary_code


def test_dictionary_sizes_are_read_from_the_stream():
    assert codecs.xz_dictionary_sizes(_xz_with_dictionary_code(b"abc" * 100, 30)) == [MAX_XZ_MEMORY]
    assert codecs.xz_dictionary_sizes(lzma.compress(b"", format=lzma.FORMAT_XZ)) == []


def test_dictionary_at_the_limit_decodes():
    """A 128 MiB declared dictionary is exactly MAX_XZ_MEMORY: accepted (liblzma's state is on top of it)."""
    data = b"abc" * 100
    assert codecs.get(codecs.XZ).decode(_xz_with_dictionary_code(data, 30), len(data)) == data


def test_dictionary_over_the_limit_is_limit():
    data = b"abc" * 100
    with pytest.raises(LimitError):
        codecs.get(codecs.XZ).decode(_xz_with_dictionary_code(data, 31), len(data))


def test_malformed_structure_is_corrupt():
    data = b"abc" * 100
    x = lzma.compress(data, format=lzma.FORMAT_XZ)
    for bad in (x[:-1], x + b"\0\0\0\0", x[:12] + x[20:], b"\xfd7zXZ\x00" + bytes(30)):
        with pytest.raises(CorruptError):
            codecs.get(codecs.XZ).decode(bad, len(data))
