"""Tenants: who a request is for, as the gateway knows it, and the cache partition it
gets (docs/trust.md#tenants).

vLLM and SGLang partition their prefix caches by the body's ``cache_salt``; a client that
chooses another tenant's salt shares that tenant's cached blocks and can time them. On a
route that names a tenant source (its policy's ``tenant``), the tenant is read from
what the gateway authenticated (a header an earlier filter sets, the mTLS peer's URI
SAN, or the route itself), never from the body, and the forwarded ``cache_salt`` is
derived from it with a key of this deployment:

    tenant_key = HMAC-SHA256(key, "ext_proc tenant\\0" || tenant)
    cache_salt = base64url(HMAC-SHA256(tenant_key, "ext_proc cache_salt\\0" [|| "\\1" || part]))

where ``part`` is the client's own salt (a string), a turn's fresh one, or nothing. A
client's salt then only divides its own tenant's partition, it never names another's
(the tenant comes first, under its own key, whatever the client sends); the HMACs are
keyed, so no salt is predictable without the key, and a salt of one deployment says
nothing of another's. The salt is 43 characters of base64url, inside what vLLM accepts
(at most 128, none of ``@ / \\ NUL``).

A proof minted on such a route names the partition (``tag``) and is honored only on a
route that puts the request in the same one (proof.py):

    tag = base64url(HMAC-SHA256(tenant_key, "ext_proc partition\\0")[:16])
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any, Final

from ext_proc.core.errors import BadRequest, RoutePolicyError, Unauthorized
from ext_proc.core.events import ContinueHeaders, Peer
from ext_proc.core.reasons import Reason
from ext_proc.core.route_policy import (
    FAIRNESS_HEADER,
    IdentityType,
    RoutePolicy,
    TenantKind,
    TenantSource,
)
from ext_proc.core.vllm_request import CACHE_SALT

# The least key length a deployment may configure (HMAC-SHA256's output).
MIN_KEY_BYTES: Final = 32

_TENANT_LABEL: Final = b"ext_proc tenant\0"
_SALT_LABEL: Final = b"ext_proc cache_salt\0"
_TAG_LABEL: Final = b"ext_proc partition\0"
# The bytes of a tag: 128 bits tell tenants apart; 22 characters of base64url.
TAG_BYTES: Final = 16
# The key of the tag in the dynamic metadata the processor returns (under the route
# metadata namespace), for Envoy's rate limits to key on.
METADATA_KEY: Final = "partition"


def identify(
    source: TenantSource, headers: tuple[tuple[str, bytes], ...], peer: Peer
) -> str | None:
    """The tenant of a request, typed by its source so that no two sources name the
    same tenant by accident; None when the request carries no identity (one header
    value, non-empty, without a comma; a validated mTLS peer with a URI SAN)."""
    if source.kind is TenantKind.ROUTE:
        return f"route:{source.value}"
    if source.kind is TenantKind.PEER_SAN:
        if not peer.mtls:
            return None
        uris = [value for kind, value in peer.identities if kind is IdentityType.URI]
        return f"uri:{uris[0]}" if uris else None
    values = [value for key, value in headers if key == source.value]
    # Two values: two filters disagree, or a client's copy survived; neither is an
    # identity. A comma is how Envoy joins two values when it hands headers over as
    # attributes (one message per request): refused in every arrangement alike.
    if len(values) != 1 or not values[0].strip() or b"," in values[0]:
        return None
    # The header's name is part of the tenant: two routes reading two headers never
    # share a partition through equal values. Latin-1 maps every byte to one character,
    # so distinct values stay distinct.
    return f"header:{source.value}:{values[0].decode('latin-1')}"


def key_for(key: bytes, tenant: str) -> bytes:
    """The tenant's own key: every salt of the tenant is derived from it."""
    return hmac.digest(key, _TENANT_LABEL + tenant.encode("utf-8", "surrogatepass"), hashlib.sha256)


def salt(tenant_key: bytes, part: str | None) -> str:
    """The ``cache_salt`` a request of the tenant is forwarded with; ``part`` (the
    client's own salt, or a turn's fresh one) divides the tenant's partition."""
    message = _SALT_LABEL
    if part is not None:
        # The marker keeps "no salt" apart from every salt (an empty one is refused).
        message += b"\1" + part.encode("utf-8", "surrogatepass")
    digest = hmac.digest(tenant_key, message, hashlib.sha256)
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def tag(tenant_key: bytes) -> str:
    """The tenant's partition as a proof names it: the same for every request of the
    tenant (whatever its client's own salt, which the prompt digest binds), another for
    each tenant, and nothing a client can derive another tenant's from."""
    digest = hmac.digest(tenant_key, _TAG_LABEL, hashlib.sha256)[:TAG_BYTES]
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def client_part(document: dict[str, Any]) -> str | None:
    """The client's own ``cache_salt``, the part its tenant's salt is combined with:
    None when it sent none (or null). Raises ``BadRequest`` for any other value: a
    string is what vLLM reads, and a list (SGLang's per-prompt salts) would name a
    partition per prompt the gateway does not derive."""
    value = document.get(CACHE_SALT)
    if value is None:
        return None
    if isinstance(value, str) and value:
        return value
    raise BadRequest(
        f"{CACHE_SALT} must be a non-empty string on this route (the gateway derives the "
        "cache partition from the tenant and it)",
        reason=Reason.CACHE_SALT_MALFORMED,
        param=CACHE_SALT,
    )


def missing(source: TenantSource) -> Unauthorized:
    """The refusal of a request on a route with ``source`` that carries no identity."""
    where = {
        TenantKind.HEADER: f"the {source.value} header (one non-empty value)",
        TenantKind.PEER_SAN: "a validated mTLS client certificate with a URI SAN",
        TenantKind.ROUTE: "the route",
    }[source.kind]
    return Unauthorized(
        f"this route serves tenants only: the request names none ({where})",
        reason=Reason.TENANT_MISSING,
    )


def unkeyed() -> RoutePolicyError:
    """The refusal of a tenant route's request when no tenant key is configured: no
    salt could be derived that a client cannot predict (an operator's error)."""
    return RoutePolicyError(
        "this route serves tenants, and the processor has no tenant key (tenants.key_file)",
        reason=Reason.TENANT_KEY_MISSING,
    )


_UNCHANGED: Final = ContinueHeaders()
_NO_FAIRNESS: Final = ContinueHeaders(removed=(FAIRNESS_HEADER,))


def headers_answer(policy: RoutePolicy, partition: str | None) -> ContinueHeaders:
    """What the answer that lets a request's headers through writes: on a route with
    ``fairness_id``, llm-d's fairness id is the tenant's ``partition`` (its tag), every
    copy the client sent removed first; a request naming no tenant (audit mode lets it
    pass) goes without one rather than with the client's."""
    if not policy.fairness_id:
        return _UNCHANGED
    if partition is None:
        return _NO_FAIRNESS
    return ContinueHeaders((FAIRNESS_HEADER,), ((FAIRNESS_HEADER, partition.encode("ascii")),))


def headers_skipped() -> RoutePolicyError:
    """The refusal of a request on a route that writes a header from its tenant when the
    processor was not sent its headers (one message per request without the route's
    override): an answer to a body cannot write headers, and a client's copy would pass."""
    return RoutePolicyError(
        "this route sets llm-d's fairness id from the tenant (fairness_id), and Envoy did "
        "not send the processor the request's headers: send them on this route "
        "(request_header_mode SEND)",
        reason=Reason.INVALID_ROUTE_POLICY,
    )
