import pytest

from ext_proc.core import errors
from ext_proc.core.errors import HttpError, ProtocolError, Refusal

# Each refusal class: its HTTP status, vLLM's error type, whether audit mode relaxes it
# (only what comes from inspecting the request) and whether clients may retry.
CLASSES = [
    (errors.BadRequest, 400, "BadRequestError", True, None),
    (errors.UnsupportedMediaType, 415, "UnsupportedMediaTypeError", True, None),
    (errors.PayloadTooLarge, 413, "PayloadTooLargeError", False, None),
    (errors.RequestTimeout, 408, "RequestTimeoutError", False, None),
    (errors.ServiceUnavailable, 503, "ServiceUnavailableError", False, 1),
]


@pytest.mark.parametrize(("cls", "status", "kind", "auditable", "retry"), CLASSES)
def test_every_error_becomes_its_refusal(cls, status, kind, auditable, retry):
    refusal = cls("the message", reason="why", param="a.b").refusal()
    assert refusal == Refusal(status, kind, "why", "the message", "a.b", auditable, retry)


def test_the_gateways_own_fault_tells_the_client_its_reason_only():
    refusal = errors.RoutePolicyError("the message", reason="why", param="a.b").refusal()
    assert refusal == Refusal(500, "InternalServerError", "why", "why", None, detail="the message")


def test_bad_request_is_the_refusal_of_a_400():
    assert errors.bad_request("m", reason="r", param="p") == Refusal(
        400, "BadRequestError", "r", "m", "p", auditable=True
    )


def test_a_protocol_error_is_no_refusal():
    # Envoy broke the message order: the stream ends in error, nothing is answered.
    assert not issubclass(ProtocolError, HttpError)
    assert not hasattr(ProtocolError("m"), "refusal")


def test_refusals_are_frozen_values():
    refusal = errors.bad_request("m", reason="r")
    with pytest.raises(AttributeError):
        refusal.status = 200  # type: ignore[misc]


def test_requests_refused_alike_share_one_refusal():
    first = errors.bad_request("m", reason="r", param="p")
    assert errors.bad_request("m", reason="r", param="p") is first
    assert errors.bad_request("m", reason="r", param="q") is not first
    assert errors.bad_request("m", reason="r", param="q") == Refusal(
        400, "BadRequestError", "r", "m", "q", auditable=True
    )
