"""Per-route token-id reuse policy, read from Envoy route metadata.

Schema (route ``metadata.filter_metadata[NAMESPACE]``, default namespace
``ext_proc.token_policy``):

    topology:         aggregated | disaggregated    (default aggregated)
    action:           strip | deny | honor | mint   (default strip when aggregated,
                                                     honor when disaggregated)
    vocab_size:       positive integer, optional    (ids must be < vocab_size, at most
                                                     2**31 and 2**31 without it: vLLM's
                                                     ids are 32-bit)
    max_ids:          positive integer, optional    (at most this many ids)
    audit:            true | false                  (default false: decisions are logged,
                                                     counted and exported, requests pass)
    unproven:         strip | deny                  (honor and mint: what unproven
                                                     kv_transfer_params get; default strip)
    keep_other_keys:  true | false                  (stripping keeps the non-policed keys)
    peers:            "type:id | type:id | ..."     (honor and mint: trusted mTLS peers;
                                                     type uri, dns or subject)
    trust_any_caller: true | false                  (honor: validated ids from anyone)
    match_prefix:     "/pd/v1/"                     (with prefix_rewrite: the route's
    prefix_rewrite:   "/v1/"                         path prefix and what replaces it
                                                     upstream; both or neither)
    connector:        nixl | '{"k": v, ...}'        (mint: the kv_transfer_params every
                                                     untrusted caller's request is sent
                                                     with, by connector name or as JSON)

docs/trust.md explains the trust model these fields select.

How the fields reach the processor (CEL attributes) is ``attributes``' business; this
module validates the values that arrive.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, TypeVar

from ext_proc.core.errors import RoutePolicyError
from ext_proc.core.reasons import Reason
from ext_proc.core.vllm_request import CONNECTOR_REQUESTS, POLICED_KEYS, TOKEN_ID_BOUND

DEFAULT_NAMESPACE: Final = "ext_proc.token_policy"
_DECIMAL = re.compile(r"[1-9][0-9]{0,17}")


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


class IdentityType(StrEnum):
    """Which part of a peer's certificate an identity names (docs/trust.md)."""

    URI = "uri"  # a URI SAN (a SPIFFE id)
    DNS = "dns"  # a DNS SAN
    SUBJECT = "subject"  # the subject's distinguished name


# A peer identity: its type and its value, matched only against the same part of a
# certificate.
Identity = tuple[IdentityType, str]


@dataclass(frozen=True, slots=True)
class RoutePolicy:
    topology: Topology = Topology.AGGREGATED
    action: Action = Action.STRIP
    vocab_size: int | None = None
    max_ids: int | None = None
    audit: bool = False
    unproven: Unproven = Unproven.STRIP
    keep_other_keys: bool = False
    peers: frozenset[Identity] = frozenset()
    trust_any_caller: bool = False
    match_prefix: str | None = None
    prefix_rewrite: str | None = None
    # Mint: the kv_transfer_params every request from a caller the route does not trust
    # is forwarded with (what the prefill server's KV connector needs), as pairs.
    connector: tuple[tuple[str, Scalar], ...] | None = None

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
# The metadata fields, in order: the one list, read off the policy itself.
FIELDS: Final = tuple(field.name for field in dataclasses.fields(RoutePolicy))


Scalar = str | float | bool | None
E = TypeVar("E", bound=StrEnum)


def _invalid(problem: str, param: str) -> RoutePolicyError:
    return RoutePolicyError(
        f"invalid route policy metadata: {problem}", reason=Reason.INVALID_ROUTE_POLICY, param=param
    )


def _choice(enum: type[E], name: str, value: Scalar, namespace: str) -> E:
    if isinstance(value, str):
        try:
            return enum(value)
        except ValueError:
            pass
    allowed = ", ".join(repr(member.value) for member in enum)
    raise _invalid(
        f"field '{namespace}.{name}' is {value!r}; allowed values: {allowed}", f"{namespace}.{name}"
    )


def _positive_int(name: str, value: Scalar, namespace: str) -> int:
    # CEL renders a metadata number as its decimal text; a float arrives only from
    # callers that pass Struct values straight through.
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        return int(value)
    if isinstance(value, float) and value.is_integer() and 0 < value < 2**53:
        return int(value)
    raise _invalid(
        f"field '{namespace}.{name}' is {value!r}; expected a positive integer",
        f"{namespace}.{name}",
    )


def _flag(name: str, value: Scalar, namespace: str) -> bool:
    if not isinstance(value, bool):
        raise _invalid(
            f"field '{namespace}.{name}' is {value!r}; allowed values: true, false",
            f"{namespace}.{name}",
        )
    return value


# An identity as Envoy renders a certificate's URI SAN, DNS SAN or subject: printable
# ASCII without "|", which separates identities (subjects contain commas and spaces),
# after its type and a colon.
_IDENTITY = re.compile(r"(uri|dns|subject):([!-{}~]([ !-{}~]{0,510}[!-{}~])?)")
PEER_SEPARATOR: Final = "|"


def _peers(value: Scalar, namespace: str) -> frozenset[Identity]:
    """Typed identities separated by "|" (CEL carries no lists)."""
    names = value.split(PEER_SEPARATOR) if isinstance(value, str) else []
    matches = [_IDENTITY.fullmatch(name.strip()) for name in names]
    if not matches or None in matches:
        raise _invalid(
            f"field '{namespace}.peers' is {value!r}; expected typed identities "
            "(uri:<URI SAN>, dns:<DNS SAN> or subject:<certificate subject>) separated by '|'",
            f"{namespace}.peers",
        )
    return frozenset((IdentityType(m.group(1)), m.group(2)) for m in matches if m is not None)


# A path prefix as a route matches it and as its rewrite replaces it.
_PATH_PREFIX = re.compile(r"/[!-~]{0,1023}")


def _path_prefix(name: str, value: Scalar, namespace: str) -> str:
    if not (isinstance(value, str) and _PATH_PREFIX.fullmatch(value)):
        raise _invalid(
            f"field '{namespace}.{name}' is {value!r}; expected a path prefix starting with '/'",
            f"{namespace}.{name}",
        )
    return value


def _connector(value: Scalar, namespace: str) -> tuple[tuple[str, Scalar], ...]:
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
    raise _invalid(
        f"field '{namespace}.connector' is {value!r}; expected a connector's name "
        f"({', '.join(CONNECTOR_REQUESTS)}) or a JSON object of scalars without "
        f"{' or '.join(POLICED_KEYS)}",
        f"{namespace}.connector",
    )


# Fields that mean something only for some actions; elsewhere they are a mistake.
_APPLIES_TO: Final = {
    "unproven": (Action.HONOR, Action.MINT),
    "peers": (Action.HONOR, Action.MINT),
    "trust_any_caller": (Action.HONOR,),
    # Never on a mint route: a caller's kept keys reach the prefill server, whose
    # response could echo them into what the gateway signs.
    "keep_other_keys": (Action.STRIP, Action.DENY, Action.HONOR),
    "connector": (Action.MINT,),
}


def admitting(name: str) -> Action:
    """An action on which the field ``name`` is valid (honor admits all but a few)."""
    allowed = _APPLIES_TO.get(name, (Action.HONOR,))
    return Action.HONOR if Action.HONOR in allowed else allowed[0]


def _check_applies(action: Action, given: Mapping[str, bool], namespace: str) -> None:
    for name, allowed in _APPLIES_TO.items():
        if given[name] and action not in allowed:
            raise _invalid(
                f"field '{namespace}.{name}' applies only to action "
                f"{' or '.join(a.value for a in allowed)}, not {action.value}",
                f"{namespace}.{name}",
            )


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


Items = tuple[tuple[str, str, Scalar], ...]


def items_of(values: Mapping[str, Scalar]) -> Items:
    """``values`` as the key ``parse_items`` caches on. The key carries each value's
    type: True == 1.0 in Python, but not here."""
    return tuple((name, type(value).__name__, value) for name, value in values.items())


@functools.lru_cache(maxsize=1024)
def parse_items(
    items: Items, size: float | None, namespace: str = DEFAULT_NAMESPACE
) -> RoutePolicy:
    """``parse`` of the values ``items_of`` made ``items`` from."""
    values = {name: value for name, _, value in items}
    if size is None and not values:
        return DEFAULT_POLICY
    if size is not None and size > len(values):
        raise _invalid(
            f"namespace '{namespace}' has {int(size)} fields but only {sorted(values)} "
            f"are known; allowed fields: {', '.join(FIELDS)}",
            namespace,
        )
    topology = Topology.AGGREGATED
    if "topology" in values:
        topology = _choice(Topology, "topology", values["topology"], namespace)
    default_action = Action.HONOR if topology is Topology.DISAGGREGATED else Action.STRIP
    action = default_action
    if "action" in values:
        action = _choice(Action, "action", values["action"], namespace)
    limits = {
        name: _positive_int(name, values[name], namespace)
        for name in ("vocab_size", "max_ids")
        if name in values
    }
    if limits.get("vocab_size", 0) > TOKEN_ID_BOUND:
        raise _invalid(
            f"field '{namespace}.vocab_size' is {limits['vocab_size']}; vLLM's token ids "
            f"are 32-bit: at most {TOKEN_ID_BOUND}",
            f"{namespace}.vocab_size",
        )
    flags = {
        name: _flag(name, values[name], namespace)
        for name in ("audit", "keep_other_keys", "trust_any_caller")
        if name in values
    }
    unproven = Unproven.STRIP
    if "unproven" in values:
        unproven = _choice(Unproven, "unproven", values["unproven"], namespace)
    peers = _peers(values["peers"], namespace) if "peers" in values else frozenset()
    rewrite = {
        name: _path_prefix(name, values[name], namespace)
        for name in ("match_prefix", "prefix_rewrite")
        if name in values
    }
    if len(rewrite) == 1:
        (given_name,) = rewrite
        raise _invalid(
            f"field '{namespace}.{given_name}' needs its twin: match_prefix and "
            "prefix_rewrite describe a route's rewrite together",
            f"{namespace}.{given_name}",
        )
    connector = _connector(values["connector"], namespace) if "connector" in values else None
    given = {
        "connector": connector is not None,
        "unproven": "unproven" in values,
        "peers": bool(peers),
        "trust_any_caller": flags.get("trust_any_caller", False),
        "keep_other_keys": flags.get("keep_other_keys", False),
    }
    _check_applies(action, given, namespace)
    return RoutePolicy(
        topology=topology,
        action=action,
        vocab_size=limits.get("vocab_size"),
        max_ids=limits.get("max_ids"),
        audit=flags.get("audit", False),
        unproven=unproven,
        keep_other_keys=flags.get("keep_other_keys", False),
        peers=peers,
        trust_any_caller=flags.get("trust_any_caller", False),
        match_prefix=rewrite.get("match_prefix"),
        prefix_rewrite=rewrite.get("prefix_rewrite"),
        connector=connector,
    )
