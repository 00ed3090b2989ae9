"""The endpoints a route's policy refuses, as the downstream paths that reach them
through the route's prefix rewrite: one RE2 regex per route, which ``envoy-config``
answers 404 right before the route, for every method, with a body or without; and the
probe paths ``check-envoy`` runs through its simulation of the route table to show that
no route forwards one.

A route refuses the token-in endpoints (``classified.TOKEN_ENDPOINTS``) unless its
policy says ``accept: token_endpoints``, and the servers' internal endpoints
(``classified.INTERNAL_ENDPOINTS``) unless it says ``accept: internal_endpoints``. The
processor refuses them from a request's body; a request without one (GET, DELETE, HEAD,
an empty POST) never reaches the processor where Envoy skips the headers (one message
per request), and most internal endpoints act without a body (``/flush_cache``,
``/sleep``, ``/pause``...). So Envoy answers them by path, before the route.

The matching rule is the processor's (``vllm_request.token_endpoint`` and
``internal_endpoint``, on the path ``vllm_request.endpoint`` reads): an upstream path
whose tail, from one of its slashes, is a refused name, in any case, followed by any
number of slashes and one escaped newline (the upstream decodes it, and Starlette's
``$`` matches before it); a ``{name}`` segment stands for any one segment
(``vllm_request.segment_pattern``, the one source of a segment's regex).
tests/tools/test_refused_paths.py holds the regex to the processor's judgement.

The rewrite's arithmetic: a route matching ``prefix`` and writing ``rewrite`` in its
place sends ``prefix + rest`` upstream as ``rewrite + rest``. A name either lies in
``rest`` after a slash (``(.*/)?name``, the slash the rewrite's own when it ends with
one), or begins at another slash of the rewrite, whose remainder is then the name's
start: ``rest`` completes it (``/x`` rewritten to ``/flu`` reaches ``/flush_cache``
from ``/xsh_cache``).

What it costs: one regex per route, matched against the path of every request that
reaches that route in the table (a request stops at the first route it matches). RE2
runs it in one pass over the path whatever the number of names; a route's literal
prefix, kept case-sensitive as the route's own match, ends the match at the first
differing byte for requests to other routes. Its program is larger than Envoy's default
limit of 100 instructions, so every generated bootstrap raises that limit
(``PROGRAM_SIZE_LIMIT``, a runtime value).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from ext_proc.core import classified
from ext_proc.core.route_policy import Accept
from ext_proc.core.vllm_request import (
    FINAL_TEMPLATE_SEGMENT,
    endpoint,
    internal_endpoint,
    name_pattern,
    segment_pattern,
    token_endpoint,
)
from ext_proc.tools.route_match import compile_re2
from ext_proc.tools.token_endpoints import is_token_path

# What may follow a name in a path the processor reads as that endpoint: slashes (it
# drops them), then one escaped newline (the upstream decodes it; Starlette's "$"
# matches before a final newline). Envoy keeps "%0A" escaped.
TAIL: Final = "/*(?:%0a)?"
# RE2's program size limit (Envoy's runtime key ``re2.max_program_size.error_level``,
# 100 by default) that every generated bootstrap sets: above the largest per-route
# regex (tests/tools/test_refused_paths.py measures it), far below what would make a
# regex costly to build (RE2 runs it in linear time whatever its size).
PROGRAM_SIZE_RUNTIME_KEY: Final = "re2.max_program_size.error_level"
PROGRAM_SIZE_LIMIT: Final = 4096
# What stands for a "{name}" segment in a probe path.
_SAMPLE_SEGMENT: Final = "m"
# The root path that probes put before each name.
_ROOT_PROBE: Final = "x"


def refused_names(accept: Iterable[Accept]) -> tuple[str, ...]:
    """The endpoints a route whose policy accepts ``accept`` refuses, but those the 404s
    before every route answer already (``token_endpoints``: under an ``inference``
    segment), whatever a route accepts."""
    accepted = frozenset(accept)
    names: list[str] = []
    if Accept.TOKEN_ENDPOINTS not in accepted:
        names += classified.TOKEN_ENDPOINTS
    if Accept.INTERNAL_ENDPOINTS not in accepted:
        names += classified.INTERNAL_ENDPOINTS
    return tuple(name for name in names if not is_token_path(name))


def class_names(refused: Accept) -> tuple[str, ...]:
    """The endpoints of one refused class (``token_endpoints`` or
    ``internal_endpoints``), but those the 404s before every route answer already."""
    return refused_names(frozenset(Accept) - {refused})


# The 404s before every route of a route table this project does not write (a
# platform's gateway, whose routes and rewrites are the operator's): one per class, so
# that a table with a route accepting a class can leave that class's out, each
# matching every path that reaches one of the class's endpoints behind any root path
# (``anywhere_regex``). Named as envoy-config names its 404s (``token-endpoint-*``).
ANYWHERE_ROUTES: Final = {
    "token-endpoint-token-in-refused": Accept.TOKEN_ENDPOINTS,
    "token-endpoint-internal-refused": Accept.INTERNAL_ENDPOINTS,
}


def anywhere_regex(names: Sequence[str]) -> str:
    """The RE2 regex of every path that reaches one of ``names`` behind any root path:
    the regex of a ``/`` route without a rewrite, which serves a table whose routes
    are not known here as long as no route's rewrite writes part of a name (``/x``
    rewritten to ``/flu`` reaches ``/flush_cache`` from ``/xsh_cache``, which it does
    not match)."""
    regex = route_regex("/", None, names)
    if regex is None:
        raise ValueError("no endpoint names")
    return regex


def refused_at(upstream: str, accept: Iterable[Accept]) -> str | None:
    """The endpoint the upstream path (query ignored) is that a route accepting
    ``accept`` refuses, as the processor judges it; None when it is none."""
    bare = endpoint(upstream.partition("?")[0])
    accepted = frozenset(accept)
    token = token_endpoint(bare)
    if token is not None and Accept.TOKEN_ENDPOINTS not in accepted:
        return token
    internal = internal_endpoint(bare)
    if internal is not None and Accept.INTERNAL_ENDPOINTS not in accepted:
        return internal
    return None


@dataclass(frozen=True, slots=True)
class Completion:
    """What follows a rewrite to make it end with a name: ``pattern`` (RE2) and one
    path it matches (``sample``)."""

    pattern: str
    sample: str


def _fits(have: str, want: str) -> bool:
    return bool(have) if want.startswith("{") else have == want


def _sample(segment: str) -> str:
    return _SAMPLE_SEGMENT if segment.startswith("{") else segment


def completion(part: str, name: str) -> Completion | None:
    """What completes ``name`` after ``part`` (the rewrite's remainder from one of its
    slashes, lower case); None when ``part`` cannot begin it."""
    have = part.split("/")[1:]
    want = name.split("/")[1:]
    if len(have) > len(want):
        # The whole name, then only slashes (a rewrite to "/flush_cache/").
        whole = all(_fits(h, w) for h, w in zip(have, want, strict=False))
        return Completion("", "") if whole and not any(have[len(want) :]) else None
    *whole_segments, last = have
    if not all(_fits(h, w) for h, w in zip(whole_segments, want, strict=False)):
        return None
    segment = want[len(whole_segments)]
    final = len(whole_segments) == len(want) - 1
    if segment.startswith("{"):
        if last:
            pattern, sample = FINAL_TEMPLATE_SEGMENT, ""
        else:
            pattern, sample = segment_pattern(segment, final=final), _SAMPLE_SEGMENT
    elif segment.startswith(last):
        pattern, sample = re.escape(segment[len(last) :]), segment[len(last) :]
    else:
        return None
    after = want[len(have) :]
    return Completion(
        pattern
        + "".join(
            "/" + segment_pattern(s, final=at == len(after) - 1) for at, s in enumerate(after)
        ),
        sample + "".join("/" + _sample(s) for s in after),
    )


def _upstream(prefix: str, rewrite: str | None) -> str:
    # The upstream decodes what the rewrite writes.
    return endpoint(rewrite if rewrite is not None else prefix).lower()


def _slashes(path: str) -> Iterator[int]:
    return (at for at, char in enumerate(path) if char == "/")


def completions(upstream: str, names: Sequence[str]) -> list[Completion]:
    """The completions of every name from every slash of ``upstream`` (lower case) but a
    final one (``route_regex`` covers that), without repeats."""
    found: dict[str, Completion] = {}
    for at in _slashes(upstream):
        if at == len(upstream) - 1:
            continue
        for name in names:
            done = completion(upstream[at:], name)
            if done is not None:
                found.setdefault(done.pattern, done)
    return list(found.values())


def route_regex(prefix: str, rewrite: str | None, names: Sequence[str]) -> str | None:
    """The RE2 regex (Envoy's ``safe_regex``, matched against the path without its query)
    of every path starting with ``prefix`` that reaches one of ``names`` through the
    rewrite; None without names. The prefix keeps its case, as the route's own match
    does; what follows it matches in any case."""
    if not names:
        return None
    upstream = _upstream(prefix, rewrite)
    bare = "|".join(name_pattern(name)[1:] for name in names)
    lead = "(?:.*/)?" if upstream.endswith("/") else ".*/"
    alternatives = [f"{lead}(?:{bare})"]
    alternatives += [done.pattern for done in completions(upstream, names)]
    return f"{re.escape(prefix)}(?i:(?:{'|'.join(alternatives)}){TAIL})"


def program_size(regex: str) -> int:
    """The size of ``regex``'s program as RE2 counts it against Envoy's limit."""
    return int(compile_re2(regex).programsize)


def probe_suffixes(rewrite: str, names: Sequence[str]) -> tuple[str, ...]:
    """What to append to a route's prefix so that the upstream path (``rewrite``, or the
    prefix itself, then the suffix) is one of ``names``: each name under the rewrite,
    behind a further root path, and completing the rewrite from each of its slashes;
    each lower and upper case, alone, with a trailing slash, an escaped newline and a
    query string."""
    upstream = rewrite.lower()
    join = "" if upstream.endswith("/") else "/"
    bases: list[str] = []
    for name in names:
        sample = "/".join(_sample(s) for s in name.split("/"))
        bases += [join + sample[1:], join + _ROOT_PROBE + sample]
    bases += [done.sample for done in completions(upstream, names)]
    spelled = [s for base in bases for s in (base, base.upper())]
    return tuple(dict.fromkeys(s + extra for s in spelled for extra in ("", "/", "%0A", "?x=1")))
