"""Inspecting one request, as values: what its headers say (``read``: a ``Request``)
and what its body decides (``inspect``: an ``Inspection``), as ``mint`` is for the
response. The stream calls them and acts on what they return.

An ``Inspection`` is the body's decision, what is forwarded instead of the body (None:
the body as it came), the Deny the request is refused with when the decision refuses
it, and what the request leaves for its response (``mint.Pending``); or, when the
decision honors a proof, the ``Proof`` the record of spent proofs is asked about first
(``settle`` decides with the record's verdict).

Invariants (fail closed):
- the exceptions that parsing and validation raise become refusals in
  ``errors.attempt`` only, and every refusal here is a ``Deny``;
- what inspecting holds (the parsed document, a rewrite) is charged to the stream's
  account (``admission``) before it is taken;
- audit mode (global, or the route's ``audit: true``) computes the same decision but
  forwards the request unchanged; it relaxes only refusals that come from inspecting
  the request (``Refusal.auditable``), never limits, timeouts or invalid route
  metadata, and only in ``enforced``.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ext_proc.core import (
    admission,
    caller,
    declared,
    events,
    memory,
    mint,
    policy,
    proof,
    route_policy,
    splice,
    tenants,
    turns,
    vllm_request,
)
from ext_proc.core.budget import Account
from ext_proc.core.caller import Caller
from ext_proc.core.config import Config
from ext_proc.core.content_headers import check_headers
from ext_proc.core.decisions import NO_PARAMS, Decision, Deny, Strip
from ext_proc.core.errors import (
    RECORD_UNAVAILABLE,
    Refusal,
    RoutePolicyError,
    attempt,
    bad_request,
)
from ext_proc.core.events import NO_PEER, BodyMode, Peer, RequestHeaders
from ext_proc.core.read_headers import CHECKED_HEADERS
from ext_proc.core.reading import Parsed
from ext_proc.core.reasons import Reason
from ext_proc.core.replay import Ticket, Verdict
from ext_proc.core.route_policy import Accept, Action, RoutePolicy
from ext_proc.core.spelling import spelled
from ext_proc.core.vllm_request import (
    CACHE_SALT,
    CARRIER_NAMES,
    EC_KEY,
    KV_KEY,
    Path,
    only_kv_params,
)


@dataclass(frozen=True, slots=True)
class Request:
    """What a request's headers say, read once (``read``)."""

    route: str  # the route's name, for metrics and logs
    request_id: str  # its x-request-id, for logs
    audit: bool  # the effective audit mode: the global setting, or the route's
    policy: RoutePolicy = route_policy.DEFAULT_POLICY
    # The API the upstream serves the request on (the path after the route's rewrite,
    # as vLLM routes it); a proof binds it.
    endpoint: str = ""
    peer: Peer = NO_PEER
    # What the route's engine declares for the endpoint (a strict_body route), else None.
    body: declared.Body | None = None
    # The refusal that ends the request at its headers; then nothing more is read.
    refused: Deny | None = None
    # A refusal of the headers that audit mode lets pass: the body's decision,
    # reported with the body.
    held: Deny | None = None
    # A decode (honor) route whose responses Envoy sends whole: their turn parameters
    # are signed (turns.py).
    turns: bool = False
    # The tenant's own key on a route that names a tenant source (tenants.key_for):
    # the body is forwarded with the cache_salt derived from it. None: no tenant route.
    partition: bytes | None = None

    @property
    def tag(self) -> str:
        """The partition as a proof names it: one minted here binds it, one honored here
        must (proof.py)."""
        return proof.NO_PARTITION if self.partition is None else tenants.tag(self.partition)


# The names ``spelling.spelled`` is asked about (``splice.Body``).
_ASKED: Final = frozenset(CARRIER_NAMES)

# A request whose headers were never sent (a mint route's response to a request the
# processor did not see): only the global audit mode applies.
_UNSEEN: Final = {audit: Request("", "", audit) for audit in (False, True)}


def unseen(audit: bool) -> Request:
    """What is known of a request before its headers: the global audit mode."""
    return _UNSEEN[audit]


@dataclass(frozen=True, slots=True)
class Proof:
    """A decision that honors a proof, held until the record says the proof was not
    spent: the ticket to ask about, and what deciding again needs."""

    ticket: Ticket
    decision: Decision
    body: splice.Body
    parsed: Parsed
    evidence: policy.Evidence
    carriers: tuple[Path, ...] | None
    pending: mint.Pending
    sender: Caller


# Made per request and only read after: a plain slotted class, as a frozen dataclass
# sets each field through object.__setattr__, several times the cost of the assignment.
@dataclass(slots=True)
class Inspection:
    """What a request's body decides."""

    decision: Decision
    # Forwarded instead of the body when the decision is enforced; None: the body.
    replacement: bytes | None = None
    # ``decision`` when it is a Deny that is enforced: the request is answered with its
    # refusal, nothing is forwarded.
    refused: Deny | None = None
    # What the request leaves for its response (a mint route's prompt digest).
    pending: mint.Pending = mint.NOTHING
    # Set when the decision honors a proof: nothing above stands until ``settle``.
    proof: Proof | None = None


def read(
    event: RequestHeaders, config: Config, *, with_body: bool, tenant_key: bytes | None = None
) -> Request:
    """The route, its policy and the endpoint; refused when the route's metadata is
    invalid, when the route serves tenants and the request names none (or no
    ``tenant_key`` is configured) and, for a request ``with_body``, when its media
    type, encoding or announced size is not accepted."""
    route = event.route
    found = _checked_headers(event.headers)
    request_id = b"".join(found["x-request-id"]).decode("latin-1")
    namespace = config.route_metadata_namespace
    parsed = attempt(route_policy.parse_items, route.items, route.size, namespace)
    if isinstance(parsed, Refusal):
        return Request(route.name, request_id, config.audit, peer=event.peer, refused=Deny(parsed))
    audit = config.audit or parsed.audit
    upstream = parsed.upstream_path(event.path)
    if upstream is None:
        outside = _outside_prefix(parsed, namespace)
        return Request(route.name, request_id, audit, parsed, peer=event.peer, refused=outside)
    endpoint = vllm_request.endpoint(upstream)
    # Token ids are a token endpoint's prompt: nothing in its body could be policed
    # into a rendered one; an internal endpoint is the operator's. Refused at the
    # headers; audit mode reports it with the body.
    denied = _endpoint_refused(endpoint, parsed.accept)
    if denied is not None and enforced(denied, audit):
        return Request(route.name, request_id, audit, parsed, endpoint, event.peer, refused=denied)
    body = None if parsed.strict_body is None else _declared(parsed.strict_body, endpoint)
    if isinstance(body, Deny):
        return Request(route.name, request_id, audit, parsed, endpoint, event.peer, refused=body)
    partition = _partition(parsed, event, tenant_key, endpoint, body)
    if isinstance(partition, Deny):
        if enforced(partition, audit):
            return Request(
                route.name, request_id, audit, parsed, endpoint, event.peer, refused=partition
            )
        denied, partition = denied or partition, None
    refused, held = _body_headers(found, audit, config.max_body_bytes) if with_body else _NONE
    return Request(
        route.name,
        request_id,
        audit,
        parsed,
        endpoint,
        event.peer,
        body,
        refused,
        held or denied,
        turns=parsed.action is Action.HONOR and event.response_body_mode is BodyMode.BUFFERED,
        partition=partition,
    )


def _partition(
    parsed: RoutePolicy,
    event: RequestHeaders,
    tenant_key: bytes | None,
    endpoint: str,
    body: declared.Body | None,
) -> bytes | Deny | None:
    """The tenant's key on a route that names a tenant source; None on any other; the
    refusal of a request that names no tenant, of any when no key is configured, and of
    one to an endpoint that cannot carry the tenant's cache_salt (``_unpartitioned``)."""
    if parsed.tenant is None:
        return None
    if tenant_key is None:
        return Deny(tenants.unkeyed().refusal())
    tenant = tenants.identify(parsed.tenant, event.headers, event.peer)
    if tenant is None:
        return Deny(tenants.missing(parsed.tenant).refusal())
    key = tenants.key_for(tenant_key, tenant)
    return _unpartitioned(endpoint, body) or key


_NONE: Final = (None, None)


def _declared(engine: str, endpoint: str) -> declared.Body | Deny:
    """What ``engine`` declares for ``endpoint`` (a ``strict_body`` route), or the
    refusal of an endpoint it declares no request model for."""
    body = declared.body(engine, endpoint)
    # An endpoint whose body the engine reads without a model (SageMaker's
    # /invocations hands it to whichever API parses it) declares nothing to hold it to.
    if body is not None and body.root is not None:
        return body
    return Deny(
        bad_request(
            f"{engine}, this route's engine (strict_body), declares no request model for "
            f"{endpoint}",
            reason=Reason.UNDECLARED_MEMBER,
        )
    )


def _unpartitioned(endpoint: str, body: declared.Body | None) -> Deny | None:
    """On a route that names a tenant source, the refusal of an endpoint whose body may
    not carry the gateway's cache_salt to the engine (SGLang's Ollama, Vertex and
    Anthropic APIs, vLLM's Cohere ones...): the tenant's prompt would land in whatever
    partition the client names there. Served: an endpoint that carries it in every
    engine of the inventory, or in the one a ``strict_body`` route names, and one that
    runs no prompt through a prefix cache (``vllm_request.tenant_endpoint``)."""
    if vllm_request.tenant_endpoint(endpoint) is not None:
        return None
    # A mount's path is the mount's, whatever model its tail's endpoint declares.
    declares = body is not None and body.root is not None and CACHE_SALT in body.models[body.root]
    if declares and not vllm_request.mounted(endpoint):
        return None
    return _refused(
        f"{endpoint} does not carry the cache partition this route sets from the tenant "
        "(cache_salt) to the engine; a route that names a tenant source does not serve it",
        Reason.TENANT_ENDPOINT_REFUSED,
    )


def _endpoint_refused(endpoint: str, accept: frozenset[Accept]) -> Deny | None:
    """The refusal of a token or internal endpoint the route does not accept."""
    token = vllm_request.token_endpoint(endpoint)
    if token is not None and Accept.TOKEN_ENDPOINTS not in accept:
        why = f"{token} takes token ids as its prompt; this route does not serve it (its "
        return _refused(why + "policy's accept: token_endpoints)", Reason.TOKEN_ENDPOINT_REFUSED)
    internal = vllm_request.internal_endpoint(endpoint)
    if internal is not None and Accept.INTERNAL_ENDPOINTS not in accept:
        why = f"{internal} is a server's internal endpoint; this route does not serve it (its "
        return _refused(
            why + "policy's accept: internal_endpoints)", Reason.INTERNAL_ENDPOINT_REFUSED
        )
    return None


def _refused(message: str, reason: Reason) -> Deny:
    return Deny(bad_request(message, reason=reason))


def _outside_prefix(parsed: RoutePolicy, namespace: str) -> Deny:
    return Deny(
        RoutePolicyError(
            f"invalid route policy metadata: the request path does not begin with the "
            f"route's match_prefix {parsed.match_prefix!r}",
            reason=Reason.INVALID_ROUTE_POLICY,
            param=f"{namespace}.match_prefix",
        ).refusal()
    )


def _body_headers(
    found: dict[str, list[bytes]], audit: bool, limit: int
) -> tuple[Deny | None, Deny | None]:
    """The headers of a request with a body, its media type and encoding, and an
    announced size: the refusal that ends it now, and the one audit mode lets pass."""
    held = None
    checked = attempt(check_headers, found["content-type"], found["content-encoding"])
    if checked is not None:
        held = Deny(checked)
        if enforced(held, audit):
            return held, None
    declared = found["content-length"]
    if len(declared) == 1 and declared[0].isdigit():
        # Refuse an announced oversized body before it is sent. Nothing is charged
        # for it: an announcement is not bytes held.
        too_large = attempt(admission.check_size, int(declared[0]), limit)
        if too_large is not None:
            return Deny(too_large), held
    return None, held


def enforced(decision: Decision, audit: bool) -> bool:
    """Whether ``decision`` is enforced: a Deny refuses the request, and what a Strip
    or a Mint forwards (a rewrite, a signed response) replaces the original; False:
    the original is forwarded unchanged. The one place audit mode relaxes anything: it
    forwards unchanged, except refusals that do not come from inspecting the request."""
    if isinstance(decision, Deny):
        return not (audit and decision.refusal.auditable)
    return not audit


def inspect(
    raw: events.Body, request: Request, account: Account, config: Config, trust: proof.Trust
) -> Inspection:
    """What the whole body ``raw`` of ``request`` decides. What it holds stays in
    ``account`` until the stream hands it over with the answers."""
    if request.held is not None:
        return _enforce(request.held, None, request, account, mint.NOTHING)
    judged = attempt(_judge, raw, request, account, config, trust)
    if isinstance(judged, Refusal):
        return _enforce(Deny(judged), None, request, account, mint.NOTHING)
    if isinstance(judged, Proof):
        return Inspection(judged.decision, pending=judged.pending, proof=judged)
    decision, parsed, pending, body = judged
    return _enforce(decision, parsed, request, account, pending, body=body)


def settle(asked: Proof, verdict: Verdict, request: Request, account: Account) -> Inspection:
    """The record's verdict on ``asked``: the decision stands (``FIRST``); the request
    is refused with a 503 to retry when the record could not be consulted
    (``UNAVAILABLE``: the record's state, not the proof's, so it is never decided as
    unproven and forwarded to recompute, and audit mode refuses it too); or it is
    decided again with the proof unproven for the verdict's reason (its parameters
    removed, or refused on a route that denies unproven ones), ``PREDATES`` included:
    a proof minted before the record began is one no retry can have honored."""
    decision, pending = asked.decision, asked.pending
    if verdict is Verdict.UNAVAILABLE:
        refused = Deny(RECORD_UNAVAILABLE, decision.id_count)
        return _enforce(refused, None, request, account, pending)
    if verdict is not Verdict.FIRST:
        pending = mint.unproven(pending)
        evidence = dataclasses.replace(asked.evidence, spent=verdict.reason)
        decision = policy.decide(
            request.policy,
            asked.parsed.document,
            evidence,
            asked.carriers,
            asked.sender,
            body=request.body,
        )
    return _enforce(decision, asked.parsed, request, account, pending, body=asked.body)


def _enforce(
    decision: Decision,
    parsed: Parsed | None,
    request: Request,
    account: Account,
    pending: mint.Pending,
    *,
    body: splice.Body | None = None,
) -> Inspection:
    """What enforcing ``decision`` on the body (``body``, read as ``parsed``) forwards,
    or refuses."""
    # Without audit mode every decision is enforced (``enforced``).
    if request.audit and not enforced(decision, True):
        return Inspection(decision, pending=pending)
    if isinstance(decision, Deny):
        return Inspection(decision, refused=decision, pending=pending)
    if parsed is not None and (isinstance(decision, Strip) or request.partition is not None):
        # Rewriting may refuse: a body too deep to write back, json.dumps's extra
        # beyond the budget, a tenant route's client salt that is not a string.
        written = attempt(_rewrite, decision, body, parsed, request.partition, account)
        if isinstance(written, Refusal):
            refused = Deny(written)
            return Inspection(refused, refused=refused, pending=pending)
        return Inspection(decision, written, pending=pending)
    return Inspection(decision, pending=pending)


def _rewrite(
    decision: Decision,
    body: splice.Body | None,
    parsed: Parsed,
    partition: bytes | None,
    account: Account,
) -> bytes:
    """The body ``decision`` forwards, written once: what a Strip removes and writes,
    and on a tenant route (``partition``) the tenant's cache_salt. What a large Strip
    that only removes forwards is cut out of ``body`` where the cut is shown to forward
    the same document (``splice``; the rewrite is the reference); it is shorter than
    the body, within the charge for a rewrite."""
    if (
        body is not None
        and len(body.raw) >= splice.MIN_BYTES
        and isinstance(decision, Strip)
        and decision.connector is None
        and not decision.salted
        and partition is None
    ):
        spliced = splice.without(body, parsed, decision.paths)
        if spliced is not None:
            return spliced
    paths: tuple[Path, ...] = ()
    connector = None
    salt = None
    if isinstance(decision, Strip):
        paths = decision.paths
        connector = None if decision.connector is None else dict(decision.connector)
        # A fresh salt per read-back: the blocks it fills serve no other prompt.
        salt = secrets.token_urlsafe(16) if decision.salted else None
    if partition is not None:
        # The tenant's salt, divided by the read-back's fresh one or else the client's.
        part = salt if salt is not None else tenants.client_part(parsed.document)
        salt = tenants.salt(partition, part)
    return admission.without(parsed, paths, account, connector, salt)


# The policy's decision, the document it was made on (None: not parsed), what the
# request leaves for its response and the body judged (None: not parsed); or the proof
# to spend before it stands.
_Judged = tuple[Decision, Parsed | None, mint.Pending, splice.Body | None] | Proof


def _judge(
    raw: events.Body, request: Request, account: Account, config: Config, trust: proof.Trust
) -> _Judged:
    """The policy's judgment of ``raw``. Charging, parsing and the prompt digest (a body
    too deep, or json.dumps's extra beyond its limits or the budget) raise their
    refusals."""
    # A mint route signs its response, a turns route its response's turn: both parse
    # every request for its prompt digest.
    minting = request.policy.action is Action.MINT or request.turns
    # How often the bytes name each carrier (None: they cannot tell).
    named = spelled(raw, CARRIER_NAMES)
    # A tenant route writes every body's cache_salt: each is parsed.
    strict = request.body is not None or request.partition is not None
    if not minting and not strict and named is not None and not any(named.values()):
        # Nothing to judge or rewrite: the body is forwarded as it came, unparsed
        # (a mint route parses every request for its prompt digest).
        account.hold(memory.held(len(raw)))
        return NO_PARAMS, None, mint.NOTHING, None
    shape = admission.admit(raw, account, config.max_json_values)
    # A route that honors ids checks them against its bound: in the pass that reads them.
    honoring = request.policy.action is Action.HONOR
    bound = policy.ids_bound(request.policy) if honoring else None
    parsed = admission.parse(raw, shape, account, lift_ids=True, ids_bound=bound)
    # The bytes with what the scan told of the carriers' names.
    body = splice.Body(raw, _ASKED, named)
    # No member but the top-level kv_transfer_params (and its policed keys) is named
    # as a carrier when the bytes spell no other name of one: then no carrier is
    # looked for.
    alone = named is not None and only_kv_params(named, parsed.document)
    # Nor any member of a name vLLM reads transfer parameters from, that its
    # response could carry back (a mint route signs only then: mint.judged).
    echo_free = alone or (
        named is not None and named[KV_KEY] <= (KV_KEY in parsed.document) and not named[EC_KEY]
    )
    carriers = () if alone else None
    # Who the caller is: decided once for the request, a second decision included.
    sender = caller.of(request.policy, request.peer)
    if request.policy.action not in policy.WEIGHS_EVIDENCE:
        decision = policy.decide(
            request.policy, parsed.document, policy.NO_EVIDENCE, carriers, sender, body=request.body
        )
        return decision, parsed, mint.NOTHING, body
    evidence = _evidence(parsed, request, account, config, trust)
    return _weigh(parsed, carriers, echo_free, request, evidence, sender=sender, body=body)


def _evidence(
    parsed: Parsed, request: Request, account: Account, config: Config, trust: proof.Trust
) -> policy.Evidence:
    """What a route that weighs evidence judges a proof by: the prompt's digest
    (computed on first use, once) and its first messages' (a turn proof's), the peer,
    the keys, the clock, the lifetimes and the partition the request is in."""
    digest = _Once(functools.partial(admission.digest, parsed, request.endpoint, account))
    settings = config.proof
    return policy.Evidence(
        digest,
        request.peer,
        trust.keys(),
        trust.clock(),
        settings.clock_skew_seconds,
        settings.ttl_seconds,
        prefix=functools.partial(_prefix, parsed, request.endpoint, account),
        turn_lifetime=settings.turn_ttl_seconds,
        partition=request.tag,
    )


def _weigh(
    parsed: Parsed,
    carriers: tuple[Path, ...] | None,
    echo_free: bool,
    request: Request,
    evidence: policy.Evidence,
    *,
    sender: Caller,
    body: splice.Body,
) -> _Judged:
    """The decision on ``body`` (read as ``parsed``) of a route that weighs evidence; the
    prompt digest is rendered only when needed (a proof to check) or kept for the
    response (a mint route on an endpoint it may sign). ``carriers``: () when no member
    but the top-level kv_transfer_params is named as a carrier; ``echo_free``: none of a
    name vLLM reads transfer parameters from. Rendering the digest may raise
    ``BadRequest`` for a body too deep, and ``PayloadTooLarge`` or ``ServiceUnavailable``
    where only json.dumps renders it (``admission.digest``)."""
    document = parsed.document
    if request.policy.action is Action.MINT:
        pending = mint.expect(request.endpoint, evidence.digest, evidence.partition)
    elif request.turns:
        messages = document.get("messages")
        pending = mint.expect_turn(request.endpoint, evidence.digest, messages, evidence.partition)
    else:
        pending = mint.NOTHING
    decision = policy.decide(
        request.policy, document, evidence, carriers, sender, body=request.body
    )
    pending = mint.judged(pending, decision, echo_free)
    if not isinstance(decision, Deny) and decision.reason in policy.SPENDS_PROOF:
        params = document[KV_KEY]
        if decision.reason is Reason.TURN_READ_BACK:
            pending = dataclasses.replace(pending, expected=turns.expected(params))
        ticket = proof.ticket(params, evidence.skew)
        return Proof(ticket, decision, body, parsed, evidence, carriers, pending, sender)
    return decision, parsed, pending, body


def _prefix(parsed: Parsed, endpoint: str, account: Account, count: int) -> bytes:
    """The prompt digest of the request with only its first ``count`` messages."""
    document = parsed.document
    return admission.digest(
        parsed, endpoint, account, {**document, "messages": document["messages"][:count]}
    )


def _checked_headers(headers: tuple[tuple[str, bytes], ...]) -> dict[str, list[bytes]]:
    """The values of each of ``CHECKED_HEADERS`` in order, in one pass over the
    headers."""
    found: dict[str, list[bytes]] = {name: [] for name in CHECKED_HEADERS}
    for key, value in headers:
        if key in found:
            found[key].append(value)
    return found


class _Once:
    """``make()`` computed on the first call only (functools.cache builds a whole LRU
    wrapper, too costly for one call per request)."""

    __slots__ = ("_make", "_value")

    def __init__(self, make: Callable[[], bytes]) -> None:
        self._make = make
        self._value: bytes | None = None

    def __call__(self) -> bytes:
        if self._value is None:
            self._value = self._make()
        return self._value
