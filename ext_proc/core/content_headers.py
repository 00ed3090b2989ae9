"""The content headers of a body the service reads (a request's, or a mint route's
response): only uncompressed ``application/json``, as vLLM's JSON routes read it."""

from __future__ import annotations

import functools
from typing import Final

from ext_proc.core.errors import UnsupportedMediaType
from ext_proc.core.reasons import Reason


def media_type(value: bytes) -> str:
    return value.split(b";", 1)[0].strip().decode("latin-1").lower()


def check_headers(content_types: list[bytes], content_encodings: list[bytes]) -> None:
    """Refuse bodies the service cannot read the way vLLM reads them.

    Only ``application/json`` is inspected, because vLLM's JSON routes refuse every
    other media type; anything else on a protected route is refused here too, so no
    body slips by under another label. A compressed body cannot be inspected. Short
    headers that pass are remembered (a few spellings carry almost every request);
    refusals and long values (the client's, up to Envoy's header limit) are not.
    """
    headers = (tuple(content_types), tuple(content_encodings))
    if sum(map(len, content_types)) + sum(map(len, content_encodings)) <= _HEADERS_REMEMBERED:
        _check_remembered(*headers)
    else:
        _check(*headers)


# The longest content headers remembered: 256 of them stay within 64 KiB.
_HEADERS_REMEMBERED: Final = 256


def _check(content_types: tuple[bytes, ...], content_encodings: tuple[bytes, ...]) -> None:
    if len(content_types) != 1 or media_type(content_types[0]) != "application/json":
        shown = b", ".join(content_types).decode("latin-1") or "none"
        raise UnsupportedMediaType(
            f"unsupported content-type ({shown}); this route accepts application/json",
            reason=Reason.UNSUPPORTED_MEDIA_TYPE,
        )
    encodings = [v.strip().lower() for v in b",".join(content_encodings).split(b",")]
    if any(e not in (b"", b"identity") for e in encodings):
        raise UnsupportedMediaType(
            "compressed request bodies (content-encoding) are not accepted on this route",
            reason=Reason.CONTENT_ENCODING,
        )


_check_remembered = functools.lru_cache(maxsize=256)(_check)
