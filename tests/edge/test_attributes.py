import pytest

from ext_proc.core.route_policy import FIELDS
from ext_proc.edge.attributes import HEADERS, PATH, PEER, ROUTE_NAME, as_cel, attribute_keys


def test_attribute_keys_follow_namespace():
    keys = attribute_keys("my.ns")
    assert keys.fields["action"] == "xds.route_metadata.filter_metadata['my.ns'].action"
    assert keys.size == "size(xds.route_metadata.filter_metadata['my.ns'])"
    assert len(keys.all()) == len(FIELDS) + 3 + len(PEER)
    assert keys.all()[len(FIELDS) + 1] == ROUTE_NAME == "xds.route_name"
    assert keys.all()[len(FIELDS) + 2] == PATH == "request.url_path"
    assert keys.all()[-len(PEER) :] == tuple(PEER.values())
    # Every SAN is read from the certificate: Envoy's SAN attributes name only the first.
    assert PEER["certificate"] == "connection.peer_certificate"
    assert PEER["validated"] == "connection.peer_certificate_valid"


def test_every_policy_field_has_an_attribute():
    assert tuple(attribute_keys().fields) == FIELDS


def test_header_attributes_name_request_headers():
    assert HEADERS["content-type"] == "request.headers['content-type']"
    assert set(HEADERS) == {"content-type", "content-encoding", "content-length", "x-request-id"}


@pytest.mark.parametrize(
    ("value", "carried"),
    [
        (131072, "131072"),
        (131072.0, "131072"),
        (0.5, "0.5"),
        ("honor", "honor"),
        (True, True),
        (None, None),
        ({"n": 1}, "CelMap value"),
        ([1], "CelList value"),
    ],
)
def test_as_cel_renders_values_as_the_attribute_carries_them(value, carried):
    assert as_cel(value) == carried
