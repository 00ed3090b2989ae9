"""Content headers: only uncompressed application/json is read, as vLLM reads it."""

import pytest

from ext_proc.core import content_headers
from ext_proc.core.errors import UnsupportedMediaType


@pytest.mark.parametrize(
    "content_type",
    [
        b"application/json",
        b"Application/JSON",
        b"application/json; charset=utf-8",
        b" application/json ",
    ],
)
def test_json_media_types_accepted(content_type):
    content_headers.check_headers([content_type], [])


@pytest.mark.parametrize(
    "content_types",
    [
        [],
        [b"text/plain"],
        [b"application/x-www-form-urlencoded"],
        [b"application/jsonx"],
        [b"application/json-seq"],
        [b"application/vnd.api+json"],
        [b"multipart/form-data; boundary=x"],
        [b"application/json", b"application/json"],
    ],
)
def test_other_media_types_refused(content_types):
    with pytest.raises(UnsupportedMediaType) as caught:
        content_headers.check_headers(content_types, [])
    assert caught.value.status == 415
    assert caught.value.reason == "unsupported_media_type"


@pytest.mark.parametrize("encodings", [[b"gzip"], [b"identity, br"], [b"identity", b"deflate"]])
def test_compressed_bodies_refused(encodings):
    with pytest.raises(UnsupportedMediaType) as caught:
        content_headers.check_headers([b"application/json"], encodings)
    assert caught.value.reason == "content_encoding"


@pytest.mark.parametrize("encodings", [[], [b"identity"], [b"Identity"]])
def test_identity_encoding_accepted(encodings):
    content_headers.check_headers([b"application/json"], encodings)


def test_passing_content_headers_are_remembered_only_when_short():
    content_headers._check_remembered.cache_clear()
    content_headers.check_headers([b"application/json"], [b"identity"])
    assert content_headers._check_remembered.cache_info().currsize == 1
    long_type = b"application/json; x=" + b"a" * 4096
    content_headers.check_headers([long_type], [])
    content_headers.check_headers([b"application/json"], [b" " * 4096])
    assert content_headers._check_remembered.cache_info().currsize == 1
    with pytest.raises(UnsupportedMediaType):  # refusals are never remembered
        content_headers.check_headers([b"text/plain"], [])
    with pytest.raises(UnsupportedMediaType):
        content_headers.check_headers([b"text/plain"], [])
    assert content_headers._check_remembered.cache_info().currsize == 1
