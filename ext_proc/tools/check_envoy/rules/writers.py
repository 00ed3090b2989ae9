"""Nothing after the header step writes back what the step took from the client. Each
class of header the step clears is judged from the last filter before this processor's
that clears it on every route, by what each later filter can write (``writes``):

- the router's retry and hedge headers (``ROUTER_HEADERS``), on a connection manager
  with a ``mint`` or ``honor`` route: the router would resend that route's body, decided
  once, without running any filter again (a proven decode leg read twice, a turn's KV
  read back twice). Any write is refused, a constant's too (``x-envoy-max-retries: 3``
  retries like a client's): ``router-header-writer``. Where no filter removes them
  all, every filter before this processor's is judged;
- the header carriers (``ROUTING_HEADERS``): a component behind the gateway reads an
  address, a peer, token ids or a prompt from them, trusting that only its peers set
  them;
- the request id (``REQUEST_ID``), which the step renews: vLLM builds its request id
  from it, and its MoRIIO connector reads a peer's address out of that id.

A carrier or the request id written from a client's value undoes the step
(``header-rewritten-by-filter``); a value the writer chose (a constant, a fresh id, an
endpoint picker's pick) is its writer's business. Where no step clears them,
``header_step`` reports it (``header-step-missing``).

A ``header_mutation`` clears a class when it is on by default, configured by no route
(Envoy applies a route's ``HeaderMutationPerRoute`` after the filter's own mutations),
and its mutations leave each header of the class removed (the request id: renewed). The
router's own options cannot stand in for the step: none turns its headers off
(``strict_check_headers`` checks their values, ``suppress_envoy_headers`` concerns the
headers it writes), and a route's ``request_headers_to_remove`` comes too late for the
hedge and per-try timeout headers (``router_headers``).

After this processor's first filter, ``after_decision`` refuses every filter but those
that keep the request and the declared ones, and bounds a declared ext_proc filter's
mutation rules (``allow_envoy`` among them). A declared filter is trusted with the
carriers and the request id it chooses (llm-d's endpoint picker writes
``x-prefiller-host-port`` there by design), never with the router's headers; what its
configuration states is judged like anyone's. Upstream filters (the router's and
clusters') run after the router chose its retries. A route's ``request_headers_to_add``
is ``header_step``'s rule (``header-rewritten-by-route``) and ``replay``'s
(``retry-header-added``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from ext_proc.tools import carrier_headers
from ext_proc.tools.check_envoy.findings import Finding, error
from ext_proc.tools.check_envoy.reader import Chain, is_ext_proc
from ext_proc.tools.check_envoy.rules.header_step import faults
from ext_proc.tools.check_envoy.writes import Write, last, per_route, request_mutations, writes
from ext_proc.tools.router_headers import ROUTER_HEADERS


def _clears_router_headers(chain: Chain, position: int) -> bool:
    entry = chain.filters[position]
    if entry.get("typed_config", {}).get("@type") != carrier_headers.FILTER_TYPE:
        return False
    if entry.get("disabled", False) or per_route(chain, str(entry.get("name"))):
        return False
    done = last(request_mutations(entry.get("typed_config")))
    return all(name in done and done[name] is None for name in ROUTER_HEADERS)


def _is_header_step(chain: Chain, position: int) -> bool:
    # header_step's own definition of a working step; a route's configuration of it is
    # that rule's finding (header-step-per-route).
    entry = chain.filters[position]
    kind = entry.get("typed_config", {}).get("@type")
    return kind == carrier_headers.FILTER_TYPE and not faults(entry)


@dataclass(frozen=True)
class Guarded:
    """A class of headers the header step clears, and what may write one after it."""

    label: str
    names: tuple[str, ...]
    code: str
    # What a client's value (or, where constants are refused, any value) there does.
    harm: str
    # Whether a filter after the step that clears them may write a value no client chose.
    constants: bool
    # Whether a declared filter after the decision is trusted with what it chooses.
    trusted: bool
    clears: Callable[[Chain, int], bool]
    # What a finding says when no filter clears them; None: nothing is judged then.
    unclear: str | None


ROUTER: Final = Guarded(
    "a header the router retries or hedges by",
    ROUTER_HEADERS,
    "router-header-writer",
    "the router would resend a mint or honor route's body decided once",
    constants=False,
    trusted=False,
    clears=_clears_router_headers,
    unclear="no header step before it removes them",
)
CARRIERS: Final = Guarded(
    "a header carrier",
    carrier_headers.ROUTING_HEADERS,
    "header-rewritten-by-filter",
    "a component behind the gateway reads a client's address, peer or prompt from it",
    constants=True,
    trusted=True,
    clears=_is_header_step,
    unclear=None,
)
REQUEST_ID: Final = Guarded(
    "the request id",
    (carrier_headers.REQUEST_ID,),
    "header-rewritten-by-filter",
    "vLLM takes a client's request id (its MoRIIO connector reads a peer's address from it)",
    constants=True,
    trusted=True,
    clears=_is_header_step,
    unclear=None,
)


def _start(chain: Chain, guarded: Guarded, first: int) -> tuple[int, str] | None:
    """Where judging ``guarded`` begins, and what the findings say of it."""
    cleared = [i for i in range(first) if guarded.clears(chain, i)]
    if cleared:
        step = chain.filters[cleared[-1]].get("name")
        return cleared[-1] + 1, f"it runs after {step}, the last filter that clears them"
    return None if guarded.unclear is None else (0, guarded.unclear)


def _refused(guarded: Guarded, write: Write, declared: bool) -> bool:
    """``declared``: the filter is a declared one after the decision."""
    if declared and guarded.trusted and not write.stated:
        return False
    return write.copies or not guarded.constants


def _part(guarded: Guarded, hits: list[tuple[str, Write]], where: str) -> str:
    hows = list(dict.fromkeys(write.how for _, write in hits))
    names = (
        "any of them"
        if len(hits) == len(guarded.names) > 1
        else ", ".join(name for name, _ in hits)
    )
    what = " from a client's value" if guarded.constants else ""
    return f"{'; '.join(hows)}: {guarded.label} ({names}){what}, and {where}: {guarded.harm}"


def writers(chain: Chain, declared: frozenset[str], decides: bool) -> Iterator[Finding]:
    """``decides``: the connection manager has a mint or honor route, whose body the
    router must not resend."""
    filters = chain.filters
    first = next(i for i, f in enumerate(filters) if f.get("name") in chain.names)
    classes = (ROUTER, CARRIERS, REQUEST_ID) if decides else (CARRIERS, REQUEST_ID)
    starts = {g: _start(chain, g, first) for g in classes}
    for position, entry in enumerate(filters):
        name = entry.get("name")
        after = position > first
        if name in chain.names or (after and name not in declared):
            continue  # ours; after_decision's rule
        can = writes(chain, entry)
        parts: dict[str, list[str]] = {}
        for guarded, start in starts.items():
            if start is None or position < start[0]:
                continue
            if guarded is ROUTER and after and is_ext_proc(entry) and _allows_envoy(entry):
                continue  # after_decision's declared-filter-unbounded
            hits = [
                (header, write)
                for header in guarded.names
                if (write := can.of(header)) is not None and _refused(guarded, write, after)
            ]
            if hits:
                parts.setdefault(guarded.code, []).append(_part(guarded, hits, start[1]))
        for code, said in parts.items():
            yield error(
                code,
                f"{chain.place} filter {name}",
                f"{'; also '.join(said)}. Remove the filter or move it before the header step",
            )


def _allows_envoy(entry: dict[str, Any]) -> bool:
    rules = entry.get("typed_config", {}).get("mutation_rules")
    return isinstance(rules, dict) and bool(rules.get("allow_envoy"))
