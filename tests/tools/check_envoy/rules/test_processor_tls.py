"""A processor that demands TLS, or a client certificate, is reached through a socket
that has them: the processor's cluster's UpstreamTlsContext verifies the processor and
presents Envoy's certificate (``--processor-config`` tells the check what it demands)."""

import copy

import pytest
import yaml

from ext_proc.__main__ import main as cli
from ext_proc.core.config import Config
from ext_proc.tools.check_envoy import check
from ext_proc.tools.check_envoy.rules.processor_tls import demand
from tests.tools.check_envoy.shipped import SHIPPED, SHIPPED_DIR, ext_proc

MTLS = yaml.safe_load((SHIPPED_DIR / "envoy-mtls.yaml").read_text())
TLS = yaml.safe_load((SHIPPED_DIR / "envoy-tls.yaml").read_text())
CODES = {
    "processor-plaintext",
    "processor-unverified",
    "processor-client-certificate-missing",
    "processor-tls-unseen",
    "processor-name-unpinned",
}


def tls_codes(config, wanted):
    return [code for code in check(config, processor=wanted).codes("error") if code in CODES]


def processor_cluster(config):
    name = ext_proc(config)["grpc_service"]["envoy_grpc"]["cluster_name"]
    (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == name]
    return cluster


def common(config):
    return processor_cluster(config)["transport_socket"]["typed_config"]["common_tls_context"]


def test_the_demand_is_read_off_the_processors_tls():
    assert demand(Config.load(environ={})) == "none"
    served = {"cert_file": "/c", "key_file": "/k"}
    assert demand(Config.load(environ={}, tls=served)) == "tls"
    assert demand(Config.load(environ={}, tls={**served, "client_ca_file": "/ca"})) == "mutual"


@pytest.mark.parametrize(
    ("config", "wanted", "expected"),
    [
        (MTLS, "mutual", []),
        (MTLS, "tls", []),
        (TLS, "tls", []),
        (TLS, "mutual", ["processor-client-certificate-missing"]),
        (SHIPPED, "mutual", ["processor-plaintext"]),
        (SHIPPED, "tls", ["processor-plaintext"]),
        (SHIPPED, "none", []),
    ],
    ids=[
        "mtls-cluster/mutual",
        "mtls-cluster/tls",
        "tls-cluster/tls",
        "tls-cluster/mutual",
        "h2c-cluster/mutual",
        "h2c-cluster/tls",
        "h2c-cluster/none",
    ],
)
def test_the_processor_cluster_has_what_the_processor_demands(config, wanted, expected):
    assert tls_codes(config, wanted) == expected


def test_a_socket_that_verifies_no_certificate_of_the_processor_is_refused():
    config = copy.deepcopy(MTLS)
    del common(config)["validation_context"]
    assert tls_codes(config, "mutual") == ["processor-unverified"]


CA = {"filename": "/etc/ext-proc/tls/ca.crt"}
PINNED = {"san_type": "DNS", "matcher": {"exact": "ext-proc.local"}}


@pytest.mark.parametrize(
    "given",
    [
        # Both accepted by envoy --mode validate (with the files present): without a
        # trusted CA (or a pinned certificate), or told to accept an untrusted chain,
        # Envoy takes any certificate for the processor's.
        {"validation_context": {"only_verify_leaf_cert_crl": False}},
        {"validation_context": {"trusted_ca": CA, "trust_chain_verification": "ACCEPT_UNTRUSTED"}},
    ],
    ids=["no-trusted-ca", "accept-untrusted"],
)
def test_a_validation_context_that_verifies_nothing_is_refused(given):
    config = copy.deepcopy(MTLS)
    del common(config)["validation_context"]
    common(config).update(given)
    assert tls_codes(config, "mutual") == ["processor-unverified"]


@pytest.mark.parametrize(
    "given",
    [
        {
            "validation_context": {
                "verify_certificate_spki": ["NvqYIYSbgK2vCJpQhObf77vv+bQWtc5ek5RIOwPiC9A="]
            }
        },
        {
            "combined_validation_context": {
                "default_validation_context": {"match_typed_subject_alt_names": [PINNED]},
                "validation_context_sds_secret_config": {"name": "processor-ca"},
            }
        },
    ],
    ids=["pinned", "sds"],
)
def test_a_validation_context_that_verifies_passes(given):
    config = copy.deepcopy(MTLS)
    del common(config)["validation_context"]
    common(config).update(given)
    assert tls_codes(config, "mutual") == []


SPIFFE = {
    "name": "envoy.tls.cert_validator.spiffe",
    "typed_config": {
        "@type": "type.googleapis.com/"
        "envoy.extensions.transport_sockets.tls.v3.SPIFFECertValidatorConfig",
        "trust_domains": [{"name": "cluster.local", "trust_bundle": CA}],
    },
}


@pytest.mark.parametrize(
    "given",
    [
        # Each verifies a chain and checks no name: any certificate the CA (a public
        # one's, the mesh's) issued is taken for the processor's.
        {"validation_context": {"trusted_ca": CA}},
        {"validation_context": {"system_root_certs": {}}},
        {"validation_context": {"custom_validator_config": SPIFFE}},
        {"validation_context_sds_secret_config": {"name": "processor-ca"}},
        {
            "combined_validation_context": {
                "default_validation_context": {"trusted_ca": CA},
                "validation_context_sds_secret_config": {"name": "processor-ca"},
            }
        },
        # A matcher that names no one name matches others.
        {"validation_context": {"trusted_ca": CA, "match_typed_subject_alt_names": []}},
        *(
            {
                "validation_context": {
                    "trusted_ca": CA,
                    "match_typed_subject_alt_names": [PINNED, {"san_type": "DNS", "matcher": m}],
                }
            }
            for m in ({"prefix": ""}, {"suffix": ".svc"}, {"safe_regex": {"regex": ".*"}})
        ),
        {"validation_context": {"trusted_ca": CA, "match_subject_alt_names": [{"exact": ""}]}},
    ],
    ids=[
        "trusted-ca",
        "system-roots",
        "spiffe-validator",
        "sds",
        "combined-sds",
        "empty-matchers",
        "prefix-matcher",
        "suffix-matcher",
        "regex-matcher",
        "empty-exact",
    ],
)
def test_a_validation_context_that_pins_no_name_of_the_processor_is_refused(given):
    config = copy.deepcopy(TLS)
    del common(config)["validation_context"]
    common(config).update(given)
    assert tls_codes(config, "tls") == ["processor-name-unpinned"]
    assert tls_codes(config, "none") == []


@pytest.mark.parametrize(
    ("given", "upstream"),
    [
        ({"trusted_ca": CA, "match_subject_alt_names": [{"exact": "ext-proc.local"}]}, {}),
        ({"trusted_ca": CA}, {"sni": "ext-proc.local", "auto_sni_san_validation": True}),
        ({"trusted_ca": CA, "verify_certificate_hash": ["ab" * 32]}, {}),
    ],
    ids=["deprecated-matcher", "auto-sni-san-validation", "pinned-certificate"],
)
def test_a_validation_context_that_pins_the_processor_passes(given, upstream):
    config = copy.deepcopy(TLS)
    common(config)["validation_context"] = given
    typed = processor_cluster(config)["transport_socket"]["typed_config"]
    typed.pop("sni")
    typed.update(upstream)
    assert tls_codes(config, "tls") == []


def test_auto_sni_san_validation_without_an_sni_pins_nothing():
    config = copy.deepcopy(TLS)
    typed = processor_cluster(config)["transport_socket"]["typed_config"]
    del typed["sni"]
    typed["auto_sni_san_validation"] = True
    # It replaces the matchers with the SNI sent, which is then no name this cluster
    # states (none, or one auto_host_sni or auto_sni picks per connection).
    assert tls_codes(config, "tls") == ["processor-name-unpinned"]


def test_a_client_certificate_from_sds_is_one():
    config = copy.deepcopy(MTLS)
    given = common(config)
    del given["tls_certificates"]
    given["tls_certificate_sds_secret_configs"] = [{"name": "envoy-client"}]
    assert tls_codes(config, "mutual") == []


def test_a_socket_chosen_per_endpoint_cannot_be_checked():
    config = copy.deepcopy(MTLS)
    cluster = processor_cluster(config)
    cluster["transport_socket_matches"] = [
        {"name": "plain", "match": {"plain": True}, "transport_socket": {"name": "raw"}}
    ]
    assert tls_codes(config, "mutual") == ["processor-tls-unseen"]


def test_another_transport_socket_is_no_tls():
    config = copy.deepcopy(MTLS)
    processor_cluster(config)["transport_socket"] = {
        "name": "envoy.transport_sockets.raw_buffer",
        "typed_config": {
            "@type": "type.googleapis.com/"
            "envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"
        },
    }
    assert tls_codes(config, "mutual") == ["processor-plaintext"]


def test_a_processor_cluster_outside_the_bootstrap_cannot_be_checked():
    listener = copy.deepcopy(MTLS["static_resources"]["listeners"][0])
    assert tls_codes(listener, "mutual") == ["processor-tls-unseen"]
    assert tls_codes(listener, "none") == []


def test_a_google_grpc_target_needs_the_same_credentials():
    config = copy.deepcopy(MTLS)
    ssl = {
        "root_certs": {"filename": "/ca.crt"},
        "cert_chain": {"filename": "/envoy.crt"},
        "private_key": {"filename": "/envoy.key"},
    }
    service = ext_proc(config)["grpc_service"]
    service.pop("envoy_grpc")
    service["google_grpc"] = {"target_uri": "ext-proc:50051", "stat_prefix": "ext_proc"}
    assert tls_codes(config, "mutual") == ["processor-plaintext"]
    service["google_grpc"]["channel_credentials"] = {"ssl_credentials": dict(ssl)}
    assert tls_codes(config, "mutual") == []
    del service["google_grpc"]["channel_credentials"]["ssl_credentials"]["private_key"]
    assert tls_codes(config, "mutual") == ["processor-client-certificate-missing"]
    del service["google_grpc"]["channel_credentials"]["ssl_credentials"]["root_certs"]
    assert tls_codes(config, "tls") == ["processor-unverified"]


def test_the_command_line_reads_the_demand_from_the_processors_config(tmp_path, capsys):
    processor = tmp_path / "config.yaml"
    processor.write_text(
        yaml.safe_dump({"tls": {"cert_file": "/c", "key_file": "/k", "client_ca_file": "/ca"}})
    )
    shipped = str(SHIPPED_DIR / "envoy.yaml")
    options = ["--no-envoy-validate", "--processor-config", str(processor)]
    assert cli(["check-envoy", shipped, *options]) == 1
    assert "error[processor-plaintext]" in capsys.readouterr().out
    assert cli(["check-envoy", str(SHIPPED_DIR / "envoy-mtls.yaml"), *options]) == 0
    assert "processor-" not in capsys.readouterr().out
    processor.write_text("tls: {cert_file: /c}\n")
    assert cli(["check-envoy", shipped, *options]) == 1
    assert "--processor-config" in capsys.readouterr().err
