"""vLLM's endpoints that are not for clients: which upstream paths they are, and which
downstream paths reach them through a route's prefix rewrite.

``/inference/v1/generate`` takes token ids by design (no chat template, no system
prompt), and the render and derender endpoints (``/render``, ``/derender``,
``/v1/chat/completions/render``, ``/v1/completions/derender``...) echo request content:
derender copies a request's nested ``generate_response(s)[].kv_transfer_params`` into
its response's top-level ``kv_transfer_params``. The policy looks at
``kv_transfer_params`` only, so these paths are answered at the gateway instead.

A path is judged as the UPSTREAM receives it, after the route's rewrite: a route
``/pd/`` rewritten to ``/`` reaches ``/inference/v1/generate`` from
``/pd/inference/v1/generate``. ``envoy-config`` answers every such path 404
(``ECHO_REGEX`` anywhere, ``rewritten_into`` per route); ``check-envoy`` probes every
route with ``probe_suffixes`` and fails a config that forwards one. Matching ignores
case (a server that matched paths case-insensitively is covered too), one trailing
slash and an escaped newline after the last segment (``ECHO_REGEX``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

from ext_proc.vllm_request import endpoint

# vLLM's token-in API: everything under it, and the bare path.
INFERENCE: Final = "/inference"
# Last path segments whose endpoints echo request content.
ECHO_SEGMENTS: Final = ("render", "derender")
# An Envoy safe_regex (RE2, matched against the whole path without its query string):
# any path whose last segment is render or derender, one trailing slash allowed, any
# case, and an escaped newline after it: the upstream percent-decodes the path, and
# Starlette's route patterns end in "$", which Python matches before a final "\n"
# ("/v1/chat/completions/render%0A" reaches vLLM's render endpoint). Envoy keeps "%0A"
# escaped (normalize_path decodes only unreserved characters). Python's re reads the
# pattern the same way.
ECHO_REGEX: Final = r"(?i).*/(de)?render/?(%0a)?"
_ECHO = re.compile(ECHO_REGEX)
# The endpoints vLLM serves today (probes for check-envoy; the rules above are wider).
KNOWN: Final = (
    "/inference/v1/generate",
    "/v1/chat/completions/render",
    "/v1/chat/completions/derender",
    "/v1/completions/render",
    "/v1/completions/derender",
    "/v1/messages/render",
    "/v1/responses/render",
    "/render",
    "/derender",
)


def is_token_path(path: str) -> bool:
    """Whether an upstream path (query string ignored) is a token-in or echo endpoint,
    read as vLLM routes it (percent-decoded, a final newline dropped)."""
    bare = endpoint(path.partition("?")[0]).lower()
    return bare == INFERENCE or bare.startswith(f"{INFERENCE}/") or bool(_ECHO.fullmatch(bare))


@dataclass(frozen=True, slots=True)
class Match:
    """A downstream path matcher, case-insensitive: ``prefix``, exact ``path``, or
    ``regex`` (RE2 as Envoy's safe_regex reads it, ``(?i)`` included)."""

    kind: Literal["prefix", "path", "regex"]
    value: str

    def matches(self, path: str) -> bool:
        bare = path.partition("?")[0]
        if self.kind == "regex":
            return re.fullmatch(self.value, bare) is not None
        if self.kind == "prefix":
            return bare.lower().startswith(self.value.lower())
        return bare.lower() == self.value.lower()


def _echo_at(path: str) -> Match:
    """``path`` as a last render or derender segment: the trailing slash and the escaped
    newline that ``ECHO_REGEX`` allows, any case."""
    return Match("regex", f"(?i){re.escape(path)}/?(%0a)?")


# Answered whatever the routes: the token-in API, and the root render and derender
# prefixes (sub-paths and longer names too).
ROOT: Final = (
    Match("prefix", f"{INFERENCE}/"),
    Match("path", INFERENCE),
    Match("prefix", "/render"),
    Match("prefix", "/derender"),
)


def _tail(path: str) -> str:
    """The last segment, as a rewrite leaves it for what follows (``/v1/`` -> ``""``)."""
    return path.rpartition("/")[2]


def rewritten_into(prefix: str, rewrite: str | None) -> tuple[Match, ...]:
    """The downstream paths of a route (matching ``prefix``, replacing it with
    ``rewrite``) that reach a token endpoint upstream and that neither ``ECHO_REGEX``
    nor ``ROOT`` catch already. A route rewritten INTO the token-in API
    (``rewrite`` under ``/inference/``) is not described here: ``reaches_only``."""
    upstream = (rewrite if rewrite is not None else prefix).lower()
    found: list[Match] = []
    inference = f"{INFERENCE}/"
    if inference.startswith(upstream):
        found.append(Match("prefix", prefix + inference[len(upstream) :]))
    if INFERENCE.startswith(upstream):
        found.append(Match("path", prefix + INFERENCE[len(upstream) :]))
    # What follows the prefix, up to its first "/", extends the rewrite's last segment:
    # "/x" rewritten to "/v1/" sends "/xrender" to "/v1/render".
    tail = _tail(upstream)
    for segment in ECHO_SEGMENTS:
        if segment.startswith(tail):
            downstream = prefix + segment[len(tail) :]
            if not _ECHO.fullmatch(downstream) and not _under_root(downstream):
                found.append(_echo_at(downstream))
    return tuple(m for m in found if not (m.kind != "regex" and _under_root(m.value, m.kind)))


def _under_root(value: str, kind: str = "path") -> bool:
    """Whether every path a ``kind`` match of ``value`` matches is answered by ``ROOT``."""
    return any(root.matches(value) and (kind == "path" or root.kind == "prefix") for root in ROOT)


def reaches_only(prefix: str, rewrite: str | None) -> bool:
    """Whether every path of the route reaches the token-in API upstream."""
    upstream = (rewrite if rewrite is not None else prefix).lower()
    return upstream.startswith(f"{INFERENCE}/")


def probe_suffixes(rewrite: str) -> tuple[str, ...]:
    """What to append to a route's prefix so that the upstream path (``rewrite``, or
    the prefix itself, then the suffix) is a token endpoint: each known endpoint under
    the rewrite and a render and derender segment after it; each in three cases, alone,
    with a trailing slash, an escaped newline and a query string."""
    lowered = rewrite.lower()
    bases = [path[len(rewrite) :] for path in KNOWN if path.startswith(lowered)]
    join = "" if rewrite.endswith("/") else "/"
    bases += [join + segment for segment in ECHO_SEGMENTS]
    if is_token_path(rewrite):
        bases.append("")
    spelled = [s for base in bases for s in (base, base.upper(), _capitalised(base))]
    return tuple(dict.fromkeys(s + extra for s in spelled for extra in ("", "/", "%0A", "?x=1")))


def _capitalised(path: str) -> str:
    return "/".join(part[:1].upper() + part[1:] for part in path.split("/"))
