"""What vLLM does with a request document: the keys it reuses and when it ignores them.

Pure queries on the document ``reading.parse`` returned; no parsing, no decisions. The
facts come from vLLM's online renderer (``_reused_prompt_token_ids``): it pops the
policed keys from ``kv_transfer_params`` whenever they are there, and renders the
messages instead when the request echoes or carries non-text content.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, TypeVar
from urllib.parse import unquote

from ext_proc.core import classified

KV_KEY: Final = "kv_transfer_params"
# vLLM's token ids are 32-bit signed: no id at or above this bound is a token of any
# model, and no route's vocabulary is larger.
TOKEN_ID_BOUND: Final = 2**31
# Encoder-cache transfer parameters: read by vLLM's EC connectors like KV_KEY by its KV
# connectors (docs/trust.md lists every carrier).
EC_KEY: Final = "ec_transfer_params"
# A step of a carrier's path that stands for every item of a list.
EVERY: Final = "*"
# The most carriers one request may have removed: each is removed by Python code, and
# no client of vLLM sends more than a few (one derender request may nest a list).
MAX_CARRIERS: Final = 64
# Every request member a server or a stack behind the gateway reads tokens, a peer, a
# request id or transfer parameters from, besides the top-level kv_transfer_params
# (which a proof covers): generated from the classification of what their sources read
# (docs/trust.md#carriers names who reads each).
CARRIERS: Final = classified.BODY_CARRIERS
# Members a source types as any JSON and a server reads named members out of: below
# each, a member named like any carrier is one, at any depth (``other_carriers``).
UNTYPED_MEMBERS: Final = classified.UNTYPED_MEMBERS
# The names a carrier has below an untyped member: every carrier's last step, and the
# transfer parameters (below one, they are not the policy's own).
DEEP_NAMES: Final = frozenset((KV_KEY, *(str(c[-1]) for c in CARRIERS if c[-1] != "*")))
# Members and chat content parts that carry prompt embeddings: refused from a caller
# the route does not trust unless it accepts them (``Accept.EMBEDDINGS``).
EMBEDDING_MEMBERS: Final = classified.EMBEDDING_MEMBERS
EMBEDDING_PART_TYPES: Final = frozenset(classified.EMBEDDING_PART_TYPES)
# The ``format`` values of media items that are embeddings or a processor's output
# (SGLang's image_data items), in every spelling SGLang takes for one, compared as it
# compares them: exactly (classification.format_spellings).
EMBEDDING_FORMATS: Final = frozenset(classified.EMBEDDING_FORMATS)
# The member names that hold embeddings, wherever they are (``embeddings``).
EMBEDDING_NAMES: Final = frozenset(
    (*(str(path[-1]) for path in EMBEDDING_MEMBERS), *EMBEDDING_PART_TYPES)
)
# A ``tokens`` that is a list is not llm-d's object: vLLM's /detokenize reads it.
TOKENS_LIST_KEPT: Final = ("tokens",)
# The member names whose presence the bytes are searched for before a body is parsed:
# every carrier's last step. With none spelled, no carrier can be present.
CARRIER_NAMES: Final = tuple(
    dict.fromkeys(
        (
            KV_KEY,
            *(str(c[-1]) for c in CARRIERS),
            *(str(c[-1]) for c in EMBEDDING_MEMBERS),
            *sorted(EMBEDDING_PART_TYPES),
            *sorted(EMBEDDING_FORMATS),
        )
    )
)
# The upstream endpoints whose response a mint route signs: their returned ids and
# connector parameters come from the server's own rendering and KV connector, never
# from the request (docs/trust.md gives the argument for each).
MINT_ENDPOINTS: Final = frozenset({"/v1/chat/completions"})

# What a prefill request's kv_transfer_params ask of a server's KV connector, by the
# connector's name (a mint route's ``connector``): vLLM's NixlConnector keeps the
# prompt's blocks for a decode server to read and answers with where to read them.
CONNECTOR_REQUESTS: Final = {
    "nixl": {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    },
}

Path = tuple[str | int, ...]
IDS_KEY: Final = "prompt_token_ids"
# The request member that salts vLLM's prefix-cache hashes (from the first block on):
# blocks filled under one salt are found only by requests with the same salt.
CACHE_SALT: Final = "cache_salt"
# Keys vLLM's reuse helper reads from kv_transfer_params; both are policed alike.
POLICED_KEYS: Final = (IDS_KEY, "prompt_features")
# Content part types that carry text only; anything else makes vLLM ignore reused ids.
TEXT_PART_TYPES: Final = frozenset({"text", "input_text", "output_text"})
# Input items (chat messages, responses input) that are text when their content is.
_TEXT_ITEM_TYPES: Final = TEXT_PART_TYPES | {"message"}


def policed_keys(params: dict[str, Any]) -> tuple[str, ...]:
    """The policed keys present in a ``kv_transfer_params`` object, in policy order."""
    found: tuple[str, ...] = ()
    if params:
        for key in POLICED_KEYS:
            if key in params:
                found = (*found, key)
    return found


def _kind(item: dict[str, Any], default: str | None = None) -> str | None:
    """An object's ``type`` when it is a string (another value names no type: a JSON
    list or object cannot be looked up in a set), else None."""
    kind = item.get("type", default)
    return kind if type(kind) is str else None


def _text_only(content: Any) -> bool:
    if content is None or isinstance(content, str):
        return True
    if isinstance(content, list):
        return all(isinstance(part, dict) and _kind(part) in TEXT_PART_TYPES for part in content)
    return False


def ignores_reused_ids(document: dict[str, Any]) -> bool:
    """True when vLLM would render the messages instead of using reused ids.

    vLLM ignores them when ``echo`` is set or the input carries non-text content. This
    errs towards True: a false True only strips ids vLLM might have used.
    """
    if document.get("echo") not in (None, False):
        return True
    system = document.get("system")
    # A string is text (``_text_only``), asked inline: most contents are one.
    if system is not None and type(system) is not str and not _text_only(system):
        return True
    for key in ("messages", "input"):
        items = document.get(key)
        if items is None or isinstance(items, str):
            continue
        if not isinstance(items, list):
            return True
        for item in items:
            if not isinstance(item, dict):
                return True
            content = item.get("content")
            if content is not None and type(content) is not str and not _text_only(content):
                return True
            # ``_kind(item, "message")``, inline: a type that is no string names none.
            kind = item.get("type", "message")
            if type(kind) is not str or kind not in _TEXT_ITEM_TYPES:
                return True
    return False


def other_carriers(document: dict[str, Any], most: int) -> tuple[Path, ...] | None:
    """The paths of ``CARRIERS`` present in ``document`` with a value other than null
    (``tokens``: other than null or a list), and below each of ``UNTYPED_MEMBERS`` any
    member with such a value named in ``DEEP_NAMES``, at any depth; list items by
    index; at most ``most`` of them (the search stops there). A carrier inside another
    is not named: the outer one goes whole. The document is walked once along
    ``_TRIE``, so each list item is met once however many carriers lie below the list.
    None when the walk would meet more than ``MAX_SEARCHED`` objects and lists: a body
    built to cost its search more than its parse is refused, not searched."""
    search = _Search(most)
    search.walk(document, _TRIE, ())
    return None if search.exhausted else tuple(search.found)


# The most objects and lists one search of a body meets (the carriers' walk, the
# embeddings' walk): far beyond any request of a real client (a chat of thousands of
# messages with a few parts each), and a bound on the Python work a body can ask for.
MAX_SEARCHED: Final = 1 << 16


@dataclass(frozen=True, slots=True)
class _Node:
    """A step of the carriers' paths: the member names below it, the node for ``EVERY``
    item or value, whether a carrier ends here, and whether an untyped member does
    (everything below it is searched by name)."""

    names: dict[str, _Node]
    every: _Node | None
    ends: bool
    deep: bool = False


# Marks in the trie's plain form: "" and "**" are never steps (json keys here are the
# inventory's names).
_ENDS: Final = ""
_DEEP: Final = "**"


def _trie(paths: tuple[tuple[str, ...], ...], deep: tuple[tuple[str, ...], ...] = ()) -> _Node:
    """The carriers' ``paths`` and the untyped members' ``deep`` paths as a tree, names
    in the order of ``paths``."""
    root: dict[str, Any] = {}
    for mark, marked in ((_ENDS, paths), (_DEEP, deep)):
        for path in marked:
            node = root
            for step in path:
                node = node.setdefault(step, {})
            node[mark] = True

    def build(node: dict[str, Any]) -> _Node:
        names = {k: build(v) for k, v in node.items() if k not in (_ENDS, _DEEP, EVERY)}
        every = build(node[EVERY]) if EVERY in node else None
        return _Node(names, every, _ENDS in node, _DEEP in node)

    return build(root)


_TRIE: Final = _trie(CARRIERS, UNTYPED_MEMBERS)


class _Search:
    """One walk along ``_TRIE``: what it found, and how many objects and lists it met."""

    __slots__ = ("exhausted", "found", "left", "most")

    def __init__(self, most: int) -> None:
        self.found: list[Path] = []
        self.most = most
        self.left = MAX_SEARCHED
        self.exhausted = False

    def walk(self, value: Any, node: _Node, path: Path) -> None:
        """Where ``node``'s carriers lie in ``value`` (below ``path``): its names, then
        ``EVERY`` item of a list or value of an object."""
        self.left -= 1
        if self.left < 0:
            self.exhausted = True
            return
        if type(value) is dict:
            for name, child in node.names.items():
                if len(self.found) >= self.most or self.exhausted:
                    return
                item = value.get(name)
                if item is None:
                    continue
                if child.ends:
                    if path or (name,) != TOKENS_LIST_KEPT or type(item) is not list:
                        self.found.append((*path, name))
                elif child.deep:
                    self.deep(item, (*path, name))
                elif type(item) is dict or type(item) is list:
                    self.walk(item, child, (*path, name))
            if node.every is not None:
                self.every(value.items(), node.every, path)
        elif type(value) is list and node.every is not None:
            self.every(enumerate(value), node.every, path)

    def every(self, items: Iterable[tuple[str | int, Any]], node: _Node, path: Path) -> None:
        for key, item in items:
            if len(self.found) >= self.most or self.exhausted:
                return
            if node.ends and item is not None:
                self.found.append((*path, key))
            elif node.deep:
                self.deep(item, (*path, key))
            elif type(item) is dict or type(item) is list:
                self.walk(item, node, (*path, key))

    def deep(self, value: Any, path: Path) -> None:
        """Every member of ``value`` (below ``path``) named in ``DEEP_NAMES`` with a
        value other than null, at any depth, none below another; counted against the
        same ``MAX_SEARCHED``. Its own stack, so no nesting exhausts Python's; a path
        is built only for what is found (``embeddings``' way)."""
        # Each object or list met: its parent's index here and its step from the parent.
        steps: list[tuple[int, str | int]] = [(-1, "")]
        stack: list[tuple[Any, int]] = [(value, 0)]
        while stack:
            self.left -= 1
            if self.left < 0:
                self.exhausted = True
                return
            item, at = stack.pop()
            if type(item) is dict:
                for key, member in item.items():
                    if key in DEEP_NAMES and member is not None:
                        if len(self.found) >= self.most:
                            return
                        self.found.append((*path, *_path(steps, at), key))
                    elif type(member) is dict or type(member) is list:
                        steps.append((at, key))
                        stack.append((member, len(steps) - 1))
            elif type(item) is list:
                for index, member in enumerate(item):
                    if type(member) is dict or type(member) is list:
                        steps.append((at, index))
                        stack.append((member, len(steps) - 1))


def embeddings(document: dict[str, Any], most: int = 1) -> tuple[Path, ...] | None:
    """The paths of prompt embeddings in ``document``, at most ``most`` of them: at any
    depth, an object whose ``type`` is one of ``EMBEDDING_PART_TYPES`` (its path ends at
    the object), and a member named like one of ``EMBEDDING_MEMBERS`` or a part type,
    (at the top level: with a value other than null), and a media item whose ``format``
    is one of ``EMBEDDING_FORMATS``. Wider than the paths the sources declare, on purpose:
    vLLM reads a content part by the member it holds when it has a ``uuid`` or no
    ``type``, and takes lists of conversations (``/v1/chat/completions/batch``); no
    shape of theirs escapes a search of every object. The walk keeps its own stack, so
    no nesting exhausts Python's. None when it would meet more than ``MAX_SEARCHED``
    objects and lists."""
    found: list[Path] = []
    # Each object or list met: its parent's index here and its step from the parent,
    # so that a path is built only for what is found (copying one per level would cost
    # the square of the depth).
    steps: list[tuple[int, str | int]] = [(-1, "")]
    stack: list[tuple[Any, int]] = [(document, 0)]
    while stack and len(found) < most:
        if len(steps) > MAX_SEARCHED:
            return None
        value, at = stack.pop()
        if type(value) is dict:
            if _kind(value) in EMBEDDING_PART_TYPES or _format(value) in EMBEDDING_FORMATS:
                found.append(_path(steps, at))
                continue
            for key, item in value.items():
                # A request's own member that is null is absent (its model's default);
                # below it, vLLM's part parser takes a part by the names it holds.
                if key in EMBEDDING_NAMES and (item is not None or at != 0):
                    found.append((*_path(steps, at), key))
                    break
                if type(item) is dict or type(item) is list:
                    steps.append((at, key))
                    stack.append((item, len(steps) - 1))
        elif type(value) is list:
            for index, item in enumerate(value):
                if type(item) is dict or type(item) is list:
                    steps.append((at, index))
                    stack.append((item, len(steps) - 1))
    return tuple(found)


def _format(item: dict[str, Any]) -> str | None:
    kind = item.get("format")
    return kind if type(kind) is str else None


def _path(steps: list[tuple[int, str | int]], at: int) -> Path:
    """The path of the node ``at`` of ``steps`` (``embeddings``)."""
    path: list[str | int] = []
    while at > 0:
        at, step = steps[at]
        path.append(step)
    return tuple(reversed(path))


def token_endpoint(path: str) -> str | None:
    """The token endpoint (``classified.TOKEN_ENDPOINTS``) that the upstream endpoint
    ``path`` (``endpoint``) is; None when it is none (``_named``)."""
    return _kinds(path)[0]


def internal_endpoint(path: str) -> str | None:
    """The internal endpoint (``classified.INTERNAL_ENDPOINTS``: weights, caches,
    profiling...) that the upstream endpoint ``path`` is; None when it is none."""
    return _kinds(path)[1]


def tenant_endpoint(path: str) -> str | None:
    """The endpoint a route that names a tenant source serves (``classified.
    TENANT_ENDPOINTS``: its body carries the gateway's cache_salt to every engine, or it
    runs no prompt through a prefix cache) that ``path`` is; None when it is none. Asked
    on tenant routes only: other routes never pay for the judgement."""
    return _remembered(_TENANTS, path, _tenant)


# Paths recently judged, with their token and internal endpoints, and (apart, since
# only tenant routes ask) their tenant endpoint: a route serves few paths. Paths are
# the client's, so each memo is emptied when full and a path longer than _KINDS_PATH is
# judged afresh, never kept: what each memo holds stays under _KINDS_MEMO * _KINDS_PATH
# characters whatever the paths Envoy lets through.
_KINDS: dict[str, tuple[str | None, str | None]] = {}
_TENANTS: dict[str, str | None] = {}
_KINDS_MEMO: Final = 1024
_KINDS_PATH: Final = 256

_T = TypeVar("_T")


def _kinds(path: str) -> tuple[str | None, str | None]:
    """``path``'s token endpoint and internal endpoint (``_named``), as judged before."""
    return _remembered(_KINDS, path, _token_and_internal)


def _token_and_internal(path: str) -> tuple[str | None, str | None]:
    return _named(path, classified.TOKEN_ENDPOINTS), _named(path, classified.INTERNAL_ENDPOINTS)


def _remembered(memo: dict[str, _T], path: str, judge: Callable[[str], _T]) -> _T:
    """``judge(path)``, kept in ``memo`` within its bounds (above)."""
    if path in memo:
        return memo[path]
    judged = judge(path)
    if len(path) <= _KINDS_PATH:
        if len(memo) >= _KINDS_MEMO:
            memo.clear()
        memo[path] = judged
    return judged


def _tenant(path: str) -> str | None:
    """The one of ``classified.TENANT_ENDPOINTS`` that ``path`` is, unless it is as much
    an endpoint not served there (a name covering as many of its segments, or more):
    a server may route it there (Starlette takes the first route registered that
    matches, literal or template), and a mount takes it whatever its tail names."""
    if mounted(path):
        return None
    served = _named(path, classified.TENANT_ENDPOINTS)
    other = _named(path, classified.UNTENANTED_ENDPOINTS)
    if served is None or (other is not None and _reach(other)[0] >= _reach(served)[0]):
        return None
    return served


def mounted(path: str) -> bool:
    """Whether ``path`` holds a server's mount (``classified.MOUNTS``) from one of its
    slashes on, in any case: at the root or behind a root path, the mount takes it."""
    lowered = path.lower()
    return any(mount in lowered for mount in classified.MOUNTS)


def _reach(name: str) -> tuple[int, bool]:
    """How much of a path ``name`` covers where it matches (every name matches a path's
    tail): its segments, then whether it is plain, since a server's literal route is the
    more specific one for a segment a template also takes."""
    return name.count("/"), "{" not in name


def _named(path: str, known: tuple[str, ...]) -> str | None:
    """The one of ``known`` that ``path`` is, behind any root path, in any case, with or
    without one trailing slash (a ``{name}`` segment stands for any one segment); the
    one covering most of it when several are (``_reach``).

    Every name begins with a slash, so a name the path ends with is the path from one
    of its slashes on: the path's few such tails are looked up, not every name tried."""
    lowered = path.lower()
    bare = lowered.rstrip("/") if path != "/" else path
    plain, templates = _index(known)
    # A final "{name}" segment may be what the path's trailing slash leaves empty: the
    # upstream decodes "/dumper/%0A" to "/dumper/\n", whose newline Starlette's
    # "[^/]+" takes as the segment, and ``endpoint`` has dropped it.
    slashed = bare + "/" if len(bare) < len(lowered) else bare
    found = [
        name
        for name in templates
        if _template(name).search(bare) or _template(name).search(slashed)
    ]
    at = bare.find("/")
    while at != -1:
        if bare[at:] in plain:
            found.append(bare[at:])
            break  # the first slash's tail is the longest
        at = bare.find("/", at + 1)
    if len(found) > 1:  # as listed, for equal reach
        found.sort(key=known.index)
    return max(found, key=_reach, default=None)


@functools.cache
def _index(known: tuple[str, ...]) -> tuple[frozenset[str], tuple[str, ...]]:
    """``known``'s plain names (a set) and its templates (``{name}`` segments)."""
    if not all(name.startswith("/") and name == name.lower() for name in known):
        raise ValueError("an endpoint's name begins with a slash and is lower case")
    templates = tuple(name for name in known if "{" in name)
    return frozenset(name for name in known if "{" not in name), templates


# What a ``{name}`` segment of an endpoint stands for: any one non-empty segment; the
# name's final one may be empty (``_named``: a newline the path ended with, dropped).
TEMPLATE_SEGMENT: Final = "[^/]+"
FINAL_TEMPLATE_SEGMENT: Final = "[^/]*"


def segment_pattern(segment: str, *, final: bool = False) -> str:
    """One ``/``-separated segment of an endpoint's name as a regex that Python's ``re``
    and RE2 (Envoy's ``safe_regex``) read alike: a ``{name}`` segment any one segment
    (``final``: the name's last, also an empty one), anything else itself. The one rule
    for what a name matches, shared by ``_named`` and the 404s ``envoy-config`` writes
    for a route's refused endpoints."""
    if segment.startswith("{"):
        return FINAL_TEMPLATE_SEGMENT if final else TEMPLATE_SEGMENT
    return re.escape(segment)


def name_pattern(name: str) -> str:
    """An endpoint's name as a regex (``segment_pattern`` for each segment)."""
    parts = name.split("/")
    return "/".join(
        segment_pattern(part, final=at == len(parts) - 1) for at, part in enumerate(parts)
    )


@functools.cache
def _template(name: str) -> re.Pattern[str]:
    return re.compile(name_pattern(name) + r"\Z")


def only_kv_params(named: dict[str, int], document: dict[str, Any]) -> bool:
    """Whether the member names counted in a body's bytes (``CARRIER_NAMES``: at least
    as many as the document holds) can all be the top-level kv_transfer_params and its
    policed keys: then no other carrier is present, and none need be looked for."""
    params = document.get(KV_KEY)
    if type(params) is not dict:
        params = _NO_PARAMS
    # Each name's room: one for kv_transfer_params when the document holds it, one for
    # a policed key when the object holds it, none for any other name.
    for name, count in named.items():
        if name == KV_KEY:
            room = KV_KEY in document
        elif name in _POLICED:
            room = name in params
        else:
            room = False
        if count > room:
            return False
    return True


_POLICED: Final = frozenset(POLICED_KEYS)
_NO_PARAMS: Final[dict[str, Any]] = {}


def endpoint(upstream_path: str) -> str:
    """The API an upstream path names, as vLLM's router reads it: percent-decoded
    (uvicorn decodes the path before Starlette routes it), one final newline dropped
    (Starlette matches a route's pattern with ``$``, which also matches before one)."""
    decoded = unquote(upstream_path)
    return decoded[:-1] if decoded.endswith("\n") else decoded
