import pytest

from ext_proc.core.address import HostPort, check_listen


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8080", HostPort("127.0.0.1", 8080)),
        ("vllm.ns.svc.cluster.local:8000", HostPort("vllm.ns.svc.cluster.local", 8000)),
        ("[::1]:9000", HostPort("::1", 9000)),
        ("localhost:65535", HostPort("localhost", 65535)),
    ],
)
def test_parse(text: str, expected: HostPort):
    assert HostPort.parse(text) == expected
    assert HostPort.parse(str(expected)) == expected


@pytest.mark.parametrize(
    "text", ["9464", ":80", "host:", "host:0", "host:65536", "host:x", "bad_host!:80", "[::1]"]
)
def test_parse_refuses(text: str):
    with pytest.raises(ValueError, match=r"host:port|neither"):
        HostPort.parse(text)


def test_port_zero_only_when_allowed():
    assert HostPort.parse("127.0.0.1:0", allow_zero=True).port == 0


def test_is_ip():
    assert HostPort.parse("10.0.0.1:1").is_ip
    assert not HostPort.parse("svc.local:1").is_ip


@pytest.mark.parametrize("text", ["127.0.0.1:0", "0.0.0.0:9000", "unix:/run/x.sock"])
def test_listen(text: str):
    assert check_listen(text) == text


@pytest.mark.parametrize("text", ["unix:", "nope", "1.2.3.4:70000"])
def test_listen_refuses(text: str):
    with pytest.raises(ValueError, match=r"unix:|host:port"):
        check_listen(text)
