"""vLLM's endpoints that are not for clients: which upstream paths they are, and which
downstream paths reach them through a route's prefix rewrite.

``/inference/v1/generate`` takes token ids by design (no chat template, no system
prompt), and the render and derender endpoints (``/render``, ``/derender``,
``/v1/chat/completions/render``, ``/v1/completions/derender``...) echo request content:
derender copies a request's nested ``generate_response(s)[].kv_transfer_params`` into
its response's top-level ``kv_transfer_params``. The policy looks at
``kv_transfer_params`` only, so these paths are answered at the gateway instead.

Whatever comes before them: vLLM started with ``--root-path /x`` serves
``/x/inference/v1/generate`` and ``/x/v1/chat/completions/render`` too (Starlette
strips the root path before routing), and a proxy in front of it may strip any other
prefix. So a token endpoint is recognised by its tail (``INFERENCE_REGEX``,
``ECHO_REGEX``): any path with a segment ``inference`` followed by nothing or by
``/...`` (the token-in API and anything vLLM adds under it, behind any root path), and
any path whose last segment is ``render`` or ``derender``. The cost of that breadth: a
deployment whose own prefix has a segment named ``inference`` (``/inference/v1/chat/
completions``) cannot be served through these configs; it fails closed, with a 404.

A path is judged as the UPSTREAM receives it, after the route's rewrite: a route
``/x`` rewritten to ``/inf`` reaches ``/inference/v1/generate`` from
``/xerence/v1/generate``. ``envoy-config`` answers every such path 404 (the two
regexes anywhere, ``ROOT``, and ``rewritten_into`` per route); ``check-envoy`` probes
every route with ``probe_suffixes`` (the known endpoints also behind a root path) and
fails a config that forwards one. Matching ignores case (vLLM's routes are
case-sensitive; a server that matched paths case-insensitively is covered too), one
trailing slash and an escaped newline after the last segment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

from ext_proc.core.vllm_request import endpoint
from ext_proc.tools.route_match import compile_re2

# vLLM's token-in API: everything under it, and the bare path.
INFERENCE: Final = "/inference"
# An Envoy safe_regex (RE2, matched against the whole path without its query string):
# a segment "inference" anywhere, then nothing, "/..." or an escaped newline (the
# upstream decodes it and Starlette's "$" matches before it), any case.
INFERENCE_REGEX: Final = r"(?i).*/inference(/.*|%0a)?"
# Last path segments whose endpoints echo request content.
ECHO_SEGMENTS: Final = ("render", "derender")
# An Envoy safe_regex (RE2, matched against the whole path without its query string):
# any path whose last segment is render or derender, one trailing slash allowed, any
# case, and an escaped newline after it: the upstream percent-decodes the path, and
# Starlette's route patterns end in "$", which Python matches before a final "\n"
# ("/v1/chat/completions/render%0A" reaches vLLM's render endpoint). Envoy keeps "%0A"
# escaped (normalize_path decodes only unreserved characters).
ECHO_REGEX: Final = r"(?i).*/(de)?render/?(%0a)?"
# Both run by RE2 here too, as Envoy runs them.
_ECHO = compile_re2(ECHO_REGEX)
_INFERENCE = compile_re2(INFERENCE_REGEX)
# The root path (vLLM's --root-path, or a prefix stripped by a proxy) that probes put
# before each known endpoint.
ROOT_PATH_PROBE: Final = "/x"
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
    bare = endpoint(path.partition("?")[0])
    return bool(_INFERENCE.fullmatch(bare) or _ECHO.fullmatch(bare))


@dataclass(frozen=True, slots=True)
class Match:
    """A downstream path matcher, case-insensitive: ``prefix``, exact ``path``, or
    ``regex`` (RE2 as Envoy's safe_regex reads it, ``(?i)`` included)."""

    kind: Literal["prefix", "path", "regex"]
    value: str

    def matches(self, path: str) -> bool:
        bare = path.partition("?")[0]
        if self.kind == "regex":
            return compile_re2(self.value).fullmatch(bare) is not None
        if self.kind == "prefix":
            return bare.lower().startswith(self.value.lower())
        return bare.lower() == self.value.lower()


# The 404s every config has, whatever its routes: a token-in and an echo path behind any
# prefix (the two regexes), and the root render and derender prefixes (sub-paths and
# longer names too).
EVERYWHERE: Final = (Match("regex", ECHO_REGEX), Match("regex", INFERENCE_REGEX))
ROOT: Final = (Match("prefix", "/render"), Match("prefix", "/derender"))


def _echo_at(path: str) -> Match:
    """``path`` as a last render or derender segment: the trailing slash and the escaped
    newline that ``ECHO_REGEX`` allows, any case."""
    return Match("regex", f"(?i){re.escape(path)}/?(%0a)?")


def _inference_at(path: str) -> Match:
    """``path`` as an ``inference`` segment: what ``INFERENCE_REGEX`` allows after it."""
    return Match("regex", f"(?i){re.escape(path)}(/.*|%0a)?")


def _tail(path: str) -> str:
    """The last segment, as a rewrite leaves it for what follows (``/v1/`` -> ``""``)."""
    return path.rpartition("/")[2]


def answered(prefix: str) -> bool:
    """Whether every path that starts with ``prefix`` is answered 404 whatever the routes
    (under the root render prefixes, or under an ``inference`` segment)."""
    lowered = prefix.lower()
    return "/inference/" in lowered or any(root.matches(prefix) for root in ROOT)


def rewritten_into(prefix: str, rewrite: str | None) -> tuple[Match, ...]:
    """The downstream paths of a route (matching ``prefix``, replacing it with
    ``rewrite``) that reach a token endpoint upstream and that ``EVERYWHERE`` and
    ``ROOT`` do not catch already: what follows the prefix, up to its first "/",
    extends the rewrite's last segment ("/x" rewritten to "/v1/" sends "/xrender" to
    "/v1/render", "/y" rewritten to "/inf" sends "/yerence/v1/generate" to
    "/inference/v1/generate"). A route rewritten INTO the token-in API (``rewrite``
    under an ``inference`` segment) is not described here: ``reaches_only``."""
    tail = _tail((rewrite if rewrite is not None else prefix).lower())
    found: list[Match] = []
    name = INFERENCE[1:]
    if name.startswith(tail):
        downstream = prefix + name[len(tail) :]
        if not _INFERENCE.fullmatch(downstream):
            found.append(_inference_at(downstream))
    for segment in ECHO_SEGMENTS:
        if segment.startswith(tail):
            downstream = prefix + segment[len(tail) :]
            if not _ECHO.fullmatch(downstream) and not answered(downstream):
                found.append(_echo_at(downstream))
    return tuple(found)


def reaches_only(prefix: str, rewrite: str | None) -> bool:
    """Whether every path of the route reaches the token-in API upstream."""
    upstream = endpoint(rewrite if rewrite is not None else prefix).lower()
    return f"{INFERENCE}/" in upstream


def probe_suffixes(rewrite: str) -> tuple[str, ...]:
    """What to append to a route's prefix so that the upstream path (``rewrite``, or
    the prefix itself, then the suffix) is a token endpoint: each known endpoint under
    the rewrite, right after it and behind a further root path (``ROOT_PATH_PROBE``),
    and completing its last segment; a render and derender segment after it; each in
    three cases, alone, with a trailing slash, an escaped newline and a query string."""
    lowered = rewrite.lower()
    join = "" if rewrite.endswith("/") else "/"
    bases = [path[len(rewrite) :] for path in KNOWN if path.startswith(lowered)]
    # The rewrite as a root path, and a root path after it.
    bases += [join + path[1:] for path in KNOWN]
    bases += [join + ROOT_PATH_PROBE[1:] + path for path in KNOWN]
    tail = _tail(lowered)
    if tail:
        for path in KNOWN:
            first = path[1:].partition("/")[0]
            if first.startswith(tail):
                bases.append(path[1 + len(tail) :])
    bases += [join + segment for segment in ECHO_SEGMENTS]
    if is_token_path(rewrite):
        bases.append("")
    spelled = [s for base in bases for s in (base, base.upper(), _capitalised(base))]
    return tuple(dict.fromkeys(s + extra for s in spelled for extra in ("", "/", "%0A", "?x=1")))


def _capitalised(path: str) -> str:
    return "/".join(part[:1].upper() + part[1:] for part in path.split("/"))
