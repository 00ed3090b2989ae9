"""Per-route token-id reuse policy, read from Envoy route metadata
(``metadata.filter_metadata[NAMESPACE]``, default namespace ``ext_proc.token_policy``).

Each field is declared once, in ``RoutePolicy``: its type and default there, and in its
``Spec`` how the value Envoy sends is read, the values it takes, the actions it applies
to and a line saying what it does. Parsing, the field list (``FIELDS``) and the field
table of README.md and docs/trust.md (``python -m devstack route-policy-docs``) are read
off that one declaration. docs/trust.md explains the trust model these fields select.

How the fields reach the processor (CEL attributes) is ``attributes``' business; this
module validates the values that arrive.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, TypeVar

from ext_proc.core import classified, declared
from ext_proc.core.errors import RoutePolicyError
from ext_proc.core.read_headers import CHECKED_HEADERS, TRACE_HEADERS
from ext_proc.core.reasons import Reason
from ext_proc.core.vllm_request import CONNECTOR_REQUESTS, POLICED_KEYS, TOKEN_ID_BOUND

DEFAULT_NAMESPACE: Final = "ext_proc.token_policy"
# llm-d's fairness id: the inference scheduler's flow-control queues requests per value.
FAIRNESS_HEADER: Final = "x-llm-d-inference-fairness-id"


class Topology(StrEnum):
    AGGREGATED = "aggregated"
    DISAGGREGATED = "disaggregated"


class Action(StrEnum):
    STRIP = "strip"
    DENY = "deny"
    HONOR = "honor"  # honor proven parameters (the decode leg)
    MINT = "mint"  # sign the response's parameters (the prefill leg)


class Unproven(StrEnum):
    STRIP = "strip"
    DENY = "deny"


class Accept(StrEnum):
    """What a route serves on purpose that it otherwise refuses from a caller it does
    not trust (docs/trust.md#carriers)."""

    EMBEDDINGS = "embeddings"  # prompt embeddings: vLLM's prompt_embeds and *_embeds parts
    TOKEN_ENDPOINTS = "token_endpoints"  # endpoints that take token ids as their prompt
    INTERNAL_ENDPOINTS = "internal_endpoints"  # weights, caches, profiling, sessions...


class IdentityType(StrEnum):
    """Which part of a peer's certificate an identity names (docs/trust.md)."""

    URI = "uri"  # a URI SAN (a SPIFFE id)
    DNS = "dns"  # a DNS SAN
    SUBJECT = "subject"  # the subject's distinguished name


class TenantKind(StrEnum):
    """Where a route reads its tenant from (docs/trust.md#tenants)."""

    HEADER = "header"  # a request header an earlier filter sets (jwt_authn, ext_authz)
    PEER_SAN = "peer_san"  # the validated mTLS peer certificate's first URI SAN
    ROUTE = "route"  # the route itself: every request on it is that tenant's


@dataclass(frozen=True, slots=True)
class TenantSource:
    kind: TenantKind
    # The header's name (HEADER) or the tenant (ROUTE); "" for PEER_SAN.
    value: str = ""

    @property
    def spelt(self) -> str:
        """The source as a route's ``tenant`` names it."""
        return f"{self.kind.value}:{self.value}" if self.value else self.kind.value


# A peer identity: its type and its value, matched only against the same part of a
# certificate.
Identity = tuple[IdentityType, str]
# A metadata value as the codec hands it over (CEL renders numbers as decimal text).
Scalar = str | float | bool | None
T = TypeVar("T")
E = TypeVar("E", bound=StrEnum)


class Rejected(ValueError):
    """A field's value cannot be read. ``expected`` says what could be; ``shown`` is
    the value as the message quotes it (by default its repr). Raised by the readers
    below, turned into ``RoutePolicyError`` by ``parse_items`` only."""

    def __init__(self, expected: str, shown: str | None = None) -> None:
        super().__init__(expected)
        self.expected = expected
        self.shown = shown


# --- readers: what Envoy sent -> the field's value, or Rejected ------------------------


def _one_of(enum: type[E]) -> Callable[[Scalar], E]:
    def read(value: Scalar) -> E:
        if isinstance(value, str):
            try:
                return enum(value)
            except ValueError:
                pass
        raise Rejected("allowed values: " + ", ".join(repr(member.value) for member in enum))

    return read


_DECIMAL = re.compile(r"[1-9][0-9]{0,17}")


def _positive_int(value: Scalar) -> int:
    # CEL renders a metadata number as its decimal text; a float arrives only from
    # callers that pass Struct values straight through.
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        return int(value)
    if isinstance(value, float) and value.is_integer() and 0 < value < 2**53:
        return int(value)
    raise Rejected("expected a positive integer")


def _vocab_size(value: Scalar) -> int:
    size = _positive_int(value)
    if size > TOKEN_ID_BOUND:
        raise Rejected(f"vLLM's token ids are 32-bit: at most {TOKEN_ID_BOUND}", shown=str(size))
    return size


def _flag(value: Scalar) -> bool:
    if not isinstance(value, bool):
        raise Rejected("allowed values: true, false")
    return value


# An identity as Envoy renders a certificate's URI SAN, DNS SAN or subject: printable
# ASCII without "|", which separates identities (subjects contain commas and spaces),
# after its type and a colon.
_IDENTITY = re.compile(r"(uri|dns|subject):([!-{}~]([ !-{}~]{0,510}[!-{}~])?)")
PEER_SEPARATOR: Final = "|"


def _peers(value: Scalar) -> frozenset[Identity]:
    """Typed identities separated by "|" (CEL carries no lists)."""
    names = value.split(PEER_SEPARATOR) if isinstance(value, str) else []
    matches = [_IDENTITY.fullmatch(name.strip()) for name in names]
    if not matches or None in matches:
        raise Rejected(
            "expected typed identities (uri:<URI SAN>, dns:<DNS SAN> or "
            "subject:<certificate subject>) separated by '|'"
        )
    return frozenset((IdentityType(m.group(1)), m.group(2)) for m in matches if m is not None)


def _accepted(value: Scalar) -> frozenset[Accept]:
    """Names of ``Accept`` separated by "|" (CEL carries no lists)."""
    names = [name.strip() for name in value.split(PEER_SEPARATOR)] if isinstance(value, str) else []
    try:
        return frozenset(Accept(name) for name in names)
    except ValueError:
        raise Rejected(
            f"expected {' and/or '.join(repr(a.value) for a in Accept)} separated by "
            f"'{PEER_SEPARATOR}'"
        ) from None


# A header name as Envoy hands it over (lower case), and a tenant a route names.
_HEADER_NAME: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,127}")
_TENANT: Final = re.compile(r"[!-~]{1,256}")
# Headers the header step removes or renews right before the processor, and those the
# processor reads that hold what the client sent (its framing, its request id moved
# aside, its trace context): a tenant read from one would be nobody's, or the client's.
_STEP_HEADERS: Final = frozenset(
    {
        *classified.HEADER_CARRIERS,
        *classified.PARTITION_HEADERS,
        *CHECKED_HEADERS,
        *TRACE_HEADERS,
        "host",
    }
)
_TENANT_FORMS: Final = "expected 'header:<lower-case header name>', 'peer_san' or 'route:<tenant>'"


def _tenant(value: Scalar) -> TenantSource:
    """``header:<name>``, ``peer_san`` or ``route:<tenant>`` (CEL carries no maps: one
    typed string, as ``peers``)."""
    text = value if isinstance(value, str) else ""
    kind, _, rest = text.partition(":")
    if text == TenantKind.PEER_SAN:
        return TenantSource(TenantKind.PEER_SAN)
    if kind == TenantKind.HEADER and _HEADER_NAME.fullmatch(rest):
        if rest in _STEP_HEADERS or rest.startswith("x-envoy-"):
            raise Rejected(
                f"{rest} is removed or renewed before the processor, or holds what the "
                "client sent; name the header your authentication filter sets"
            )
        return TenantSource(TenantKind.HEADER, rest)
    if kind == TenantKind.ROUTE and _TENANT.fullmatch(rest):
        return TenantSource(TenantKind.ROUTE, rest)
    raise Rejected(_TENANT_FORMS)


_ENGINE = re.compile(r"[a-z][a-z0-9-]{0,31} [0-9A-Za-z.+-]{1,32}")


def _engine(value: Scalar) -> str:
    """An engine and release whose request models the catalog holds (``vllm 0.32.0``)."""
    known = declared.engines()
    if not (isinstance(value, str) and _ENGINE.fullmatch(value) and value in known):
        raise Rejected("expected one of " + ", ".join(repr(name) for name in sorted(known)))
    return value


# A path prefix as a route matches it and as its rewrite replaces it.
_PATH_PREFIX = re.compile(r"/[!-~]{0,1023}")


def _path_prefix(value: Scalar) -> str:
    if not (isinstance(value, str) and _PATH_PREFIX.fullmatch(value)):
        raise Rejected("expected a path prefix starting with '/'")
    return value


def _connector(value: Scalar) -> tuple[tuple[str, Scalar], ...]:
    """A connector's name (``CONNECTOR_REQUESTS``) or a JSON object of scalars: the
    kv_transfer_params written into a mint route's requests. Never the policed keys:
    ids are the prefill server's to produce."""
    request: object = None
    if isinstance(value, str):
        request = CONNECTOR_REQUESTS.get(value)
        if request is None and value.startswith("{"):
            try:
                request = json.loads(value)
            except ValueError:
                request = None
    if (
        isinstance(request, dict)
        and request
        and all(isinstance(v, str | int | float | bool) or v is None for v in request.values())
        and not any(key in request for key in POLICED_KEYS)
    ):
        return tuple((str(key), item) for key, item in request.items())
    raise Rejected(
        f"expected a connector's name ({', '.join(CONNECTOR_REQUESTS)}) or a JSON object "
        f"of scalars without {' or '.join(POLICED_KEYS)}"
    )


# --- the schema ------------------------------------------------------------------------

ALL_ACTIONS: Final = tuple(Action)


@dataclass(frozen=True, slots=True)
class Spec:
    """A field beyond its type and default: how Envoy's value is read, what values it
    takes (markdown, for the docs), the actions it means something on (elsewhere a
    value other than false is invalid metadata), and what it does (one line)."""

    read: Callable[[Scalar], Any]
    values: str
    doc: str
    actions: tuple[Action, ...] = ALL_ACTIONS
    # The default as the docs state it, where the field's own default does not say it.
    default_doc: str | None = None
    # Another field the route must give with this one (unless this one is false).
    needs: str | None = None


_SPEC: Final = "spec"


def _field(default: T, read: Callable[[Scalar], T], values: str, doc: str, **more: Any) -> T:
    spec = Spec(read, values, doc, **more)
    return dataclasses.field(default=default, metadata={_SPEC: spec})


def _choices(enum: type[StrEnum]) -> str:
    return " | ".join(f"`{member.value}`" for member in enum)


_BOOL: Final = "`false` | `true`"
_PATH: Final = "a path prefix (`/...`)"
_CONNECTORS: Final = ", ".join(f"`{name}`" for name in CONNECTOR_REQUESTS)
_POLICED: Final = ", ".join(f"`{key}`" for key in POLICED_KEYS)


@dataclass(frozen=True, slots=True)
class RoutePolicy:
    """A route's policy; each field's ``Spec`` is in its metadata (``SCHEMA``)."""

    topology: Topology = _field(
        Topology.AGGREGATED,
        _one_of(Topology),
        _choices(Topology),
        "which servers sit behind the route; sets the default action",
    )
    action: Action = _field(
        Action.STRIP,
        _one_of(Action),
        _choices(Action),
        "what the route does with a caller's `kv_transfer_params`: remove them, refuse "
        "them, honor trusted ones, or honor trusted ones and sign the response's",
        default_doc="`strip` (aggregated), `honor` (disaggregated)",
    )
    vocab_size: int | None = _field(
        None,
        _vocab_size,
        f"a positive integer, at most {TOKEN_ID_BOUND}",
        "honored ids must be below it (without it, below 2**31: vLLM's ids are 32-bit)",
    )
    max_ids: int | None = _field(
        None, _positive_int, "a positive integer", "at most this many honored ids"
    )
    audit: bool = _field(
        False,
        _flag,
        _BOOL,
        "report only: decisions are logged, counted and exported, requests pass",
    )
    unproven: Unproven = _field(
        Unproven.STRIP,
        _one_of(Unproven),
        _choices(Unproven),
        "what untrusted parameters get: removed as on `strip`, or a 400",
        actions=(Action.HONOR, Action.MINT),
    )
    # Never on a mint route: a caller's kept keys reach the prefill server, whose
    # response could echo them into what the gateway signs.
    keep_other_keys: bool = _field(
        False,
        _flag,
        _BOOL,
        f"removing untrusted parameters takes only {_POLICED} and the proof, keeping the "
        "caller's other keys",
        actions=(Action.STRIP, Action.DENY, Action.HONOR),
    )
    peers: frozenset[Identity] = _field(
        frozenset(),
        _peers,
        f"typed identities separated by `{PEER_SEPARATOR}`",
        "mTLS peers whose parameters are trusted, each `uri:<URI SAN>`, `dns:<DNS SAN>` "
        "or `subject:<subject>` (e.g. `uri:spiffe://cluster.local/ns/llm-d/sa/router | "
        "subject:CN=router,O=acme`)",
        actions=(Action.HONOR, Action.MINT),
    )
    trust_any_caller: bool = _field(
        False,
        _flag,
        _BOOL,
        "validated ids from any caller are honored (`check-envoy` warns)",
        actions=(Action.HONOR,),
    )
    match_prefix: str | None = _field(
        None,
        _path_prefix,
        _PATH,
        "the route's own path prefix, stated with `prefix_rewrite` (both or neither): the "
        "processor computes the upstream path from them",
    )
    prefix_rewrite: str | None = _field(
        None, _path_prefix, _PATH, "what the route's rewrite puts in place of `match_prefix`"
    )
    # Mint: the kv_transfer_params every request from a caller the route does not trust
    # is forwarded with (what the prefill server's KV connector needs), as pairs.
    connector: tuple[tuple[str, Scalar], ...] | None = _field(
        None,
        _connector,
        f"a connector's name ({_CONNECTORS}) or a JSON object of scalars",
        "the `kv_transfer_params` every request from a caller the route does not trust is "
        "forwarded with, in place of whatever it sent",
        actions=(Action.MINT,),
    )
    accept: frozenset[Accept] = _field(
        frozenset(),
        _accepted,
        ", ".join(f"`{a.value}`" for a in Accept) + f", separated by `{PEER_SEPARATOR}`",
        "what the route serves that it otherwise refuses with a 400: prompt embeddings "
        "from a caller it does not trust (a trusted caller's always pass); endpoints that "
        "take token ids as their prompt (`/generative_scoring`...) and the servers' "
        "internal endpoints (`/collective_rpc`, `/update_weights`...), to any caller",
    )
    tenant: TenantSource | None = _field(
        None,
        _tenant,
        "`header:<name>` | `peer_san` | `route:<tenant>`",
        "who the request is for: a header an earlier filter sets from the caller's "
        "credentials, the mTLS peer's URI SAN, or the route; the forwarded `cache_salt` is "
        "then derived from it (and the caller's own salt), a request without one is "
        "refused with a 401",
    )
    # Set from the tenant, never from the request: a client's copy names any tenant's
    # share of the scheduler (docs/trust.md#tenants).
    fairness_id: bool = _field(
        False,
        _flag,
        _BOOL,
        f"llm-d's fairness id (`{FAIRNESS_HEADER}`) is set to the tenant's partition id, "
        "replacing the client's copy (a request naming no tenant goes without one); needs "
        "`tenant`",
        needs="tenant",
    )
    strict_body: str | None = _field(
        None,
        _engine,
        "an engine and release of the inventory (`vllm 0.32.0`, `sglang 0.5.23`)",
        "forward only the members that engine declares for the endpoint; anything else a "
        "caller the route does not trust sent is removed (refused where the route denies "
        "untrusted parameters)",
    )

    @property
    def untrusted_denied(self) -> bool:
        """Whether untrusted kv_transfer_params get a 400 rather than being stripped."""
        if self.action is Action.DENY:
            return True
        return self.action in (Action.HONOR, Action.MINT) and self.unproven is Unproven.DENY

    def upstream_path(self, path: str) -> str | None:
        """The path the upstream receives for a request path, after the route's prefix
        rewrite; None when ``path`` does not begin with the route's ``match_prefix``:
        the metadata does not describe the route that matched."""
        if self.match_prefix is None or self.prefix_rewrite is None:
            return path
        if not path.startswith(self.match_prefix):
            return None
        return self.prefix_rewrite + path[len(self.match_prefix) :]


DEFAULT_POLICY: Final = RoutePolicy()
# Every field's Spec, in the order of the fields: the metadata's one list.
SCHEMA: Final[Mapping[str, Spec]] = {
    field.name: field.metadata[_SPEC] for field in dataclasses.fields(RoutePolicy)
}
FIELDS: Final = tuple(SCHEMA)
# Two fields that describe one thing, a route's rewrite: both or neither.
_TWINS: Final = ("match_prefix", "prefix_rewrite")


def admitting(name: str) -> Action:
    """An action on which the field ``name`` is valid (honor admits all but a few)."""
    allowed = SCHEMA[name].actions
    return Action.HONOR if Action.HONOR in allowed else allowed[0]


# A valid value of each field another field needs, to read that field on its own.
_NEEDED: Final[Mapping[str, Scalar]] = {"tenant": "route:any"}


def beside(name: str) -> dict[str, Scalar]:
    """What the field ``name`` can be read beside on its own (``parse``): an action it
    applies to, and a value of the field it needs."""
    fields: dict[str, Scalar] = {} if name == "action" else {"action": admitting(name).value}
    needs = SCHEMA[name].needs
    if needs is not None:
        fields[needs] = _NEEDED[needs]
    return fields


def _invalid(problem: str, param: str) -> RoutePolicyError:
    return RoutePolicyError(
        f"invalid route policy metadata: {problem}", reason=Reason.INVALID_ROUTE_POLICY, param=param
    )


def _read(name: str, value: Scalar, namespace: str) -> Any:
    try:
        return SCHEMA[name].read(value)
    except Rejected as rejected:
        shown = rejected.shown if rejected.shown is not None else repr(value)
        raise _invalid(
            f"field '{namespace}.{name}' is {shown}; {rejected.expected}", f"{namespace}.{name}"
        ) from None


def parse(
    values: Mapping[str, Scalar], size: float | None, namespace: str = DEFAULT_NAMESPACE
) -> RoutePolicy:
    """Build the policy from the fields present in the route metadata.

    ``values`` maps field names to what Envoy sent; ``size`` is the number of keys in
    the namespace (``None`` when the route has no such metadata). Raises
    ``RoutePolicyError`` naming the bad field; never guesses. Every request of a route
    carries the same metadata, so valid results are cached (errors are not).
    """
    return parse_items(items_of(values), size, namespace)


def parse_whole(policy: Mapping[str, Scalar], namespace: str = DEFAULT_NAMESPACE) -> RoutePolicy:
    """``parse`` of a route's whole metadata mapping, as an offline reader of the Envoy
    configuration holds it: a field the policy does not declare is named (the processor
    itself sees only the declared fields and how many there are)."""
    for name in policy:
        if name not in SCHEMA:
            raise _invalid(
                f"unknown field '{namespace}.{name}'; allowed fields: {', '.join(FIELDS)}",
                f"{namespace}.{name}",
            )
    return parse(policy, len(policy), namespace)


Items = tuple[tuple[str, str, Scalar], ...]


def items_of(values: Mapping[str, Scalar]) -> Items:
    """``values`` as the key ``parse_items`` caches on. The key carries each value's
    type: True == 1.0 in Python, but not here."""
    return tuple((name, type(value).__name__, value) for name, value in values.items())


@functools.lru_cache(maxsize=1024)
def parse_items(
    items: Items, size: float | None, namespace: str = DEFAULT_NAMESPACE
) -> RoutePolicy:
    """``parse`` of the values ``items_of`` made ``items`` from. Fields are read in
    their declared order; the first bad one is named."""
    values = {name: value for name, _, value in items}
    if size is None and not values:
        return DEFAULT_POLICY
    if size is not None and size > len(values):
        raise _invalid(
            f"namespace '{namespace}' has {int(size)} fields but only {sorted(values)} "
            f"are known; allowed fields: {', '.join(FIELDS)}",
            namespace,
        )
    given = {name: _read(name, values[name], namespace) for name in FIELDS if name in values}
    if "action" not in given and given.get("topology") is Topology.DISAGGREGATED:
        given["action"] = Action.HONOR
    policy: RoutePolicy = dataclasses.replace(DEFAULT_POLICY, **given)
    if len(twins := [name for name in _TWINS if name in given]) == 1:
        raise _invalid(
            f"field '{namespace}.{twins[0]}' needs its twin: match_prefix and "
            "prefix_rewrite describe a route's rewrite together",
            f"{namespace}.{twins[0]}",
        )
    for name, value in given.items():
        needs = SCHEMA[name].needs
        if value is not False and needs is not None and needs not in given:
            raise _invalid(
                f"field '{namespace}.{name}' needs field '{namespace}.{needs}'",
                f"{namespace}.{name}",
            )
        # false is every route's default; any other value is a statement about the route.
        allowed = SCHEMA[name].actions
        if value is not False and policy.action not in allowed:
            raise _invalid(
                f"field '{namespace}.{name}' applies only to action "
                f"{' or '.join(a.value for a in allowed)}, not {policy.action.value}",
                f"{namespace}.{name}",
            )
    return policy


@functools.lru_cache(maxsize=1024)
def read_headers(items: Items, size: float | None, namespace: str) -> frozenset[str]:
    """The request headers a request on the route is read by: ``CHECKED_HEADERS`` and,
    on a route whose tenant is a header's, that header (``tenants.identify``). An
    invalid policy names no tenant: the request is refused before one is read."""
    try:
        policy = parse_items(items, size, namespace)
    except RoutePolicyError:
        return _CHECKED
    tenant = policy.tenant
    if tenant is None or tenant.kind is not TenantKind.HEADER:
        return _CHECKED
    return _CHECKED | {tenant.value}


_CHECKED: Final = frozenset(CHECKED_HEADERS)
