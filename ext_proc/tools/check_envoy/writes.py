"""What an HTTP filter can write into a request's headers, read from its configuration:
the one reading behind every rule about writes after the header step (``rules.writers``).

A filter's writes are of two kinds. Stated ones its configuration spells out, header
and value: a ``header_mutation``'s own mutations and every route's
``HeaderMutationPerRoute`` for it (applied after the filter's own), ``local_ratelimit``'s
``request_headers_to_add_when_not_enforced``. Each value is an Envoy format string, and
any command in it but the fresh id may carry what a client sent (``%REQ(...)%``, the
path, a query parameter, SNI...). Chosen ones a program decides at run time, from
whatever the request holds: an ext_proc or ext_authz server, within the mutation rules
Envoy checks its writes against (``permits``), and a Lua script, a Wasm module, a
``composite`` filter or one from ECDS, which nothing here can bound. A filter known to
write no request header writes neither."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ext_proc.tools import carrier_headers
from ext_proc.tools.check_envoy.reader import FILTER_CONFIG, Chain, is_ext_proc, walk
from ext_proc.tools.check_envoy.rules.filter_types import LOCAL_RATELIMIT, WRITES_NO_HEADER

_T: Final = "type.googleapis.com/envoy.extensions.filters.http."
EXT_AUTHZ: Final = _T + "ext_authz.v3.ExtAuthz"
# Headers Envoy's mutation rules keep from a server unless allow_all_routing
# (mutation_rules.cc, Checker::getRoutingHeaders).
_ROUTING: Final = frozenset({"host", ":authority", ":method", ":scheme"})


def client_derived(value: str) -> bool:
    """Whether a header value Envoy formats may carry what a client sent: any command
    but the header step's own fresh id."""
    return "%" in value.replace(carrier_headers.NEW_ID, "")


@dataclass(frozen=True)
class Write:
    """One way a filter can write one header: ``how`` says it, ``copies`` whether the
    value may be a client's, ``stated`` whether the configuration spells it out (else
    a server or a script chooses it)."""

    how: str
    copies: bool
    stated: bool


@dataclass(frozen=True)
class Writes:
    """What one filter can write. ``stated``: each header its configuration writes, with
    every value it may be left holding; ``chooser``: who else may write headers (a
    server, a script), else None; ``rules``: the mutation rules Envoy checks the
    chooser's writes against, None when it checks none."""

    stated: Mapping[str, tuple[str, ...]]
    verb: str = "sets"
    chooser: str | None = None
    rules: Mapping[str, Any] | None = None

    def of(self, name: str) -> Write | None:
        """How the filter can write the header ``name`` (lower case), or None."""
        values = self.stated.get(name)
        if values:
            copies = any(client_derived(v) for v in values)
            shown = ", ".join(repr(v) for v in values)
            return Write(f"it {self.verb} {name} to {shown}", copies, stated=True)
        if self.chooser is not None and permits(self.rules, name):
            return Write(self.chooser, copies=True, stated=False)
        return None


NONE: Final = Writes({})


def permits(rules: Mapping[str, Any] | None, name: str) -> bool:
    """Whether Envoy's header mutation rules let a server write ``name``, in the order
    Envoy's ``Checker::isAllowed`` asks (mutation_rules.cc): the disallowing expression,
    the allowing one, ``disallow_all``, the routing, system and ``x-envoy-`` headers.
    No rules at all check nothing."""
    if rules is None:
        return True
    if _matches(rules.get("disallow_expression"), name, unreadable=False):
        return False
    if _matches(rules.get("allow_expression"), name, unreadable=True):
        return True
    if rules.get("disallow_all"):
        return False
    if name in _ROUTING and not rules.get("allow_all_routing"):
        return False
    if name.startswith(":") and rules.get("disallow_system"):
        return False
    return not (name.startswith("x-envoy-") and not rules.get("allow_envoy"))


def _matches(matcher: Any, name: str, unreadable: bool) -> bool:
    """Whether a ``RegexMatcher`` matches the whole name; ``unreadable`` when its regex
    cannot be read here (each caller's answer is the one that fails closed)."""
    if not isinstance(matcher, dict):
        return False
    try:
        return re.fullmatch(str(matcher.get("regex", "")), name) is not None
    except re.error:
        return unreadable


def _inner(given: Any) -> dict[str, Any] | None:
    """A route-level configuration as its filter reads it: a ``FilterConfig`` wrapper's
    inner one."""
    if isinstance(given, dict) and given.get("@type") == FILTER_CONFIG:
        given = given.get("config")
    return given if isinstance(given, dict) else None


def per_route(chain: Chain, name: str) -> list[dict[str, Any]]:
    """Every route-level configuration of filter ``name`` (a ``FilterConfig`` wrapper's
    inner one), at any level of the route configuration."""
    found = []
    for node in walk(chain.manager.get("route_config", {})):
        configs = node.get("typed_per_filter_config")
        given = _inner(configs.get(name)) if isinstance(configs, dict) else None
        if given is not None:
            found.append(given)
    return found


def route_configs(levels: Sequence[Any], name: str) -> list[dict[str, Any]]:
    """The route-level configurations of filter ``name`` on one route (``levels``: its
    typed_per_filter_config mappings, most specific first), in that order: the order a
    ``header_mutation`` applies them in after its own, unless
    ``most_specific_header_mutations_wins`` reverses it (header_mutation.cc)."""
    found = (_inner(level.get(name)) for level in levels if isinstance(level, dict))
    return [given for given in found if given is not None]


def request_mutations(config: Any) -> list[Any]:
    """A ``header_mutation`` configuration's request mutations, in Envoy's order."""
    mutations = config.get("mutations", {}) if isinstance(config, dict) else {}
    found = mutations.get("request_mutations") if isinstance(mutations, dict) else None
    return found if isinstance(found, list) else []


APPEND: Final = "APPEND_IF_EXISTS_OR_ADD"
OVERWRITE: Final = "OVERWRITE_IF_EXISTS_OR_ADD"


@dataclass(frozen=True)
class Mutation:
    """The last thing a list of header mutations does to one header: ``value`` None for
    a removal, else the value written by Envoy's ``action``; ``keeps_empty`` whether an
    empty value is written at all (``keep_empty_value``: else Envoy writes nothing and
    the header keeps what it held)."""

    value: str | None
    action: str = APPEND
    keeps_empty: bool = False


def _action(option: dict[str, Any]) -> str:
    # The deprecated ``append`` flag, where set, stands for the action (Envoy refuses
    # both at once): false overwrites.
    if isinstance(option.get("append"), bool):
        return APPEND if option["append"] else OVERWRITE
    return str(option.get("append_action", APPEND))


def last_mutations(mutations: list[Any]) -> dict[str, Mutation]:
    """What a list of header mutations last does to each header it touches, read in
    order as Envoy applies them."""
    done: dict[str, Mutation] = {}
    for mutation in mutations:
        if not isinstance(mutation, dict):
            continue
        if isinstance(mutation.get("remove"), str):
            done[mutation["remove"].lower()] = Mutation(None)
        option = mutation.get("append")
        header = option.get("header") if isinstance(option, dict) else None
        if isinstance(option, dict) and isinstance(header, dict):
            done[str(header.get("key", "")).lower()] = Mutation(
                str(header.get("value", "")),
                _action(option),
                bool(option.get("keep_empty_value", False)),
            )
    return done


def last(mutations: list[Any]) -> dict[str, str | None]:
    """What a list of header mutations last does to each header it touches: None for a
    removal, else the value written."""
    return {name: done.value for name, done in last_mutations(mutations).items()}


def writes(chain: Chain, entry: dict[str, Any]) -> Writes:
    """What the filter ``entry`` of ``chain`` can write into a request's headers."""
    config = entry.get("typed_config", {})
    kind = config.get("@type")
    if kind in WRITES_NO_HEADER:
        return NONE
    if kind == carrier_headers.FILTER_TYPE:
        levels = [config, *per_route(chain, str(entry.get("name")))]
        stated: dict[str, tuple[str, ...]] = {}
        for level in levels:
            for name, value in last(request_mutations(level)).items():
                if value is not None and value not in stated.get(name, ()):
                    stated[name] = (*stated.get(name, ()), value)
        return Writes(stated)
    if kind == LOCAL_RATELIMIT:
        added: dict[str, tuple[str, ...]] = {}
        for option in config.get("request_headers_to_add_when_not_enforced", []):
            header = option.get("header", {}) if isinstance(option, dict) else {}
            if isinstance(header, dict):
                name = str(header.get("key", "")).lower()
                added[name] = (*added.get(name, ()), str(header.get("value", "")))
        return Writes(added, verb="adds")
    if is_ext_proc(entry):
        rules = config.get("mutation_rules")
        return Writes(
            {},
            chooser="its server may write it (mutation_rules let it through)",
            rules=rules if isinstance(rules, dict) else {},
        )
    if kind == EXT_AUTHZ:
        rules = config.get("decoder_header_mutation_rules")
        if not isinstance(rules, dict):
            return Writes(
                {}, chooser="without decoder_header_mutation_rules its server may write any header"
            )
        return Writes(
            {},
            chooser="its server may write it (decoder_header_mutation_rules let it through)",
            rules=rules,
        )
    return Writes({}, chooser=f"it ({kind or 'no typed_config'}) may write any request header")
