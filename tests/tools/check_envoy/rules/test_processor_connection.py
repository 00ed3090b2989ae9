"""The processor's cluster bounds the streams on one HTTP/2 connection and the frames
queued on it: without either, bodies queued for a processor slow to read can end the
connection as an outbound flood (a warning: replies stay sound)."""

import pytest
import yaml

from ext_proc.tools.check_envoy import check
from tests.tools.check_envoy.shipped import OURS, SHIPPED_CONFIGS, found, mutated

CODE = "processor-connection-unbounded"
HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def _unbounded(report):
    return [hit for hit in found(report, "warning") if hit[0] == CODE]


def _h2(config):
    (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == "ext_proc"]
    options = cluster["typed_extension_protocol_options"][HTTP_OPTIONS]
    return options["explicit_http_config"]["http2_protocol_options"]


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_bounds_the_processor_connection(path):
    assert _unbounded(check(yaml.safe_load(path.read_text()))) == []


@pytest.mark.parametrize("key", ["max_concurrent_streams", "max_outbound_frames"])
def test_a_processor_cluster_without_a_bound_is_warned_of(key):
    report = mutated(lambda config: _h2(config).pop(key))
    assert _unbounded(report) == [(CODE, f"{OURS} cluster ext_proc")]
    assert report.errors == []


def test_a_processor_cluster_without_http2_options_is_warned_of():
    def change(config):
        (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == "ext_proc"]
        del cluster["typed_extension_protocol_options"]

    assert _unbounded(mutated(change)) == [(CODE, f"{OURS} cluster ext_proc")]
