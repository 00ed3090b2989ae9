"""The connection to the processor is as authenticated as the processor demands.

A processor whose configuration has ``tls`` serves only TLS; with ``tls.client_ca_file``
it serves only callers presenting a certificate signed by that CA (mTLS): whoever else
reaches its port could have a mint route's attributes and a body of its choosing signed.
Envoy must then reach it through a socket it reads whole: the processor's cluster's
``transport_socket`` an ``UpstreamTlsContext`` that verifies the processor's certificate
and, for mTLS, presents a client certificate (or a ``google_grpc`` target with the same
``ssl_credentials``). A ``transport_socket_matches`` may pick another socket per
endpoint, and a cluster this check cannot see (CDS, a document that is no bootstrap)
cannot show one: both are refused when the processor demands TLS.

A CA verifies a chain and no name: Envoy checks the upstream's name only against
``match_typed_subject_alt_names`` (or the deprecated ``match_subject_alt_names``), or
with ``auto_sni_san_validation`` against the SNI sent. Without either, any certificate
that CA issued (a public site's, another mesh workload's) is taken for the processor's,
and whoever holds one can pass every request. The validation must name the processor
exactly, or pin its certificate or key.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from ext_proc.core.config import Config
from ext_proc.tools.check_envoy.findings import Finding, error

# What the processor demands of its callers: nothing (plain h2c), TLS, or mTLS.
Demand = Literal["none", "tls", "mutual"]
UPSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
_CLIENT_CERTIFICATE = (
    "tls_certificates",
    "tls_certificate_sds_secret_configs",
    "tls_certificate_provider_instance",
)
# Validation that arrives at run time (SDS, a certificate provider): taken as given.
_VALIDATION_FROM = (
    "validation_context_sds_secret_config",
    "validation_context_certificate_provider_instance",
)
_COMBINED_FROM = (
    "validation_context_sds_secret_config",
    "validation_context_certificate_provider",
    "validation_context_certificate_provider_instance",
)
# What in a CertificateValidationContext makes Envoy verify the peer: a CA (given, from a
# provider, or the system's), a pinned certificate or key, or a validator extension
# (SPIFFE). Without one Envoy verifies no chain, whatever else the context says.
_VERIFIES = (
    "trusted_ca",
    "ca_certificate_provider_instance",
    "system_root_certs",
    "verify_certificate_hash",
    "verify_certificate_spki",
    "custom_validator_config",
)


# A pinned certificate or key is the processor's identity itself.
_PINS = ("verify_certificate_hash", "verify_certificate_spki")


def demand(config: Config) -> Demand:
    """What the processor configured by ``config`` serves."""
    if config.tls is None:
        return "none"
    return "mutual" if config.tls.client_ca_file else "tls"


def _static(config: Any, name: Any) -> dict[str, Any] | None:
    resources = config.get("static_resources") if isinstance(config, dict) else None
    listed = resources.get("clusters", []) if isinstance(resources, dict) else []
    found = [c for c in listed if isinstance(c, dict) and c.get("name") == name]
    return found[0] if len(found) == 1 else None


def _given(mapping: Any, keys: tuple[str, ...]) -> bool:
    return isinstance(mapping, dict) and any(mapping.get(key) for key in keys)


def processor_tls(
    place: str, entry: dict[str, Any], config: Any, wanted: Demand
) -> Iterator[Finding]:
    """``entry``: this processor's ext_proc filter; ``config``: the whole configuration
    (canonical spelling); ``wanted``: what the processor demands (``demand``)."""
    if wanted == "none":
        return
    service = entry["typed_config"].get("grpc_service", {})
    if isinstance(service.get("google_grpc"), dict):
        yield from _google_grpc(place, service["google_grpc"], wanted)
        return
    name = service.get("envoy_grpc", {}).get("cluster_name")
    cluster = _static(config, name)
    if cluster is None:
        yield error(
            "processor-tls-unseen",
            place,
            f"the processor demands {_words(wanted)} and its cluster {name!r} is not one "
            "static cluster of this bootstrap: its transport socket cannot be checked",
        )
        return
    where = f"{place} cluster {name}"
    if "transport_socket_matches" in cluster:
        yield error(
            "processor-tls-unseen",
            where,
            "transport_socket_matches may choose another socket per endpoint; give the "
            "processor's cluster one transport_socket",
        )
        return
    typed = cluster.get("transport_socket", {}).get("typed_config", {})
    if not isinstance(typed, dict) or typed.get("@type") != UPSTREAM_TLS:
        yield error(
            "processor-plaintext",
            where,
            f"the processor demands {_words(wanted)} and Envoy reaches it without an "
            "UpstreamTlsContext transport_socket: every stream fails",
        )
        return
    yield from _upstream_tls(where, typed, wanted)


def _upstream_tls(where: str, typed: dict[str, Any], wanted: Demand) -> Iterator[Finding]:
    """What the processor's cluster's ``UpstreamTlsContext`` (``typed``) lacks: a
    verified certificate of the processor, its name, and the client certificate
    ``wanted`` may demand."""
    common = typed.get("common_tls_context", {})
    if not _verifies(common):
        yield error(
            "processor-unverified",
            where,
            "the UpstreamTlsContext verifies no certificate of the processor (no "
            "validation_context with a trusted CA or a pinned certificate, or one that "
            "accepts an untrusted chain): any listener on its address is taken for it",
        )
    elif not _pins_name(typed, common):
        yield error(
            "processor-name-unpinned",
            where,
            "the UpstreamTlsContext verifies a chain and no name of the processor: give its "
            "validation context match_typed_subject_alt_names naming it exactly (or set "
            "auto_sni_san_validation with its name as sni), or pin its certificate; as it "
            "is, any certificate of that CA is taken for the processor's",
        )
    if wanted == "mutual" and not _given(common, _CLIENT_CERTIFICATE):
        yield error(
            "processor-client-certificate-missing",
            where,
            "the processor demands a client certificate (tls.client_ca_file) and the "
            "UpstreamTlsContext presents none: every stream is refused",
        )


def _verifies(common: Any) -> bool:
    """Whether a ``CommonTlsContext`` verifies the peer's certificate: a validation
    context that does (and does not accept an untrusted chain), or one from SDS or a
    certificate provider."""
    if not isinstance(common, dict):
        return False
    if _given(common, _VALIDATION_FROM):
        return True
    context = common.get("validation_context")
    combined = common.get("combined_validation_context")
    if isinstance(combined, dict):
        if _given(combined, _COMBINED_FROM):
            return True
        context = combined.get("default_validation_context")
    if not isinstance(context, dict):
        return False
    # SystemRootCerts has no field: present, even empty, it verifies with the system's CAs.
    if not (_given(context, _VERIFIES) or isinstance(context.get("system_root_certs"), dict)):
        return False
    # TrustChainVerification: ACCEPT_UNTRUSTED is 1.
    trust = str(context.get("trust_chain_verification", "")).strip().upper()
    return trust not in ("ACCEPT_UNTRUSTED", "1")


def _validation_context(common: dict[str, Any]) -> Any:
    """The validation context this configuration states (an SDS or provider one's
    fields are not in it)."""
    combined = common.get("combined_validation_context")
    if isinstance(combined, dict):
        return combined.get("default_validation_context")
    return common.get("validation_context")


def _exact(matcher: Any) -> bool:
    """A ``StringMatcher`` that matches one name only (``exact``, any case or not)."""
    return (
        isinstance(matcher, dict)
        and set(matcher) <= {"exact", "ignore_case"}
        and isinstance(matcher.get("exact"), str)
        and bool(matcher["exact"].strip())
    )


def _pins_name(typed: dict[str, Any], common: Any) -> bool:
    """Whether a verifying ``UpstreamTlsContext`` accepts only the processor's
    certificate: every SAN matcher one exact name (Envoy accepts a certificate any one
    of them matches), a pinned certificate or key, or ``auto_sni_san_validation`` with
    an ``sni`` (it replaces the matchers with the SNI sent)."""
    if typed.get("auto_sni_san_validation"):
        sni = typed.get("sni")
        return isinstance(sni, str) and bool(sni.strip())
    context = _validation_context(common) if isinstance(common, dict) else None
    if not isinstance(context, dict):
        return False
    if _given(context, _PINS):
        return True
    typed_matchers = context.get("match_typed_subject_alt_names") or []
    plain_matchers = context.get("match_subject_alt_names") or []
    if not isinstance(typed_matchers, list) or not isinstance(plain_matchers, list):
        return False
    matchers = [m.get("matcher") if isinstance(m, dict) else None for m in typed_matchers]
    matchers += plain_matchers
    return bool(matchers) and all(_exact(matcher) for matcher in matchers)


def _google_grpc(place: str, target: dict[str, Any], wanted: Demand) -> Iterator[Finding]:
    ssl = target.get("channel_credentials", {}).get("ssl_credentials")
    if not isinstance(ssl, dict):
        yield error(
            "processor-plaintext",
            place,
            f"the processor demands {_words(wanted)} and google_grpc has no ssl_credentials",
        )
        return
    if not ssl.get("root_certs"):
        yield error(
            "processor-unverified",
            place,
            "google_grpc ssl_credentials names no root_certs to verify the processor with",
        )
    if wanted == "mutual" and not (ssl.get("cert_chain") and ssl.get("private_key")):
        yield error(
            "processor-client-certificate-missing",
            place,
            "the processor demands a client certificate (tls.client_ca_file) and "
            "google_grpc ssl_credentials presents none",
        )


def _words(wanted: Demand) -> str:
    return "a client certificate (mTLS)" if wanted == "mutual" else "TLS"
