"""The one error hierarchy.

Every failure the service can name is an ``ExtProcError`` carrying an HTTP status hint.
``stream.Stream`` is the single boundary that turns an ``HttpError`` into a denial sent to
the client; a ``ProtocolError`` (Envoy broke the ext_proc message order) ends the gRPC
stream with an error instead, which Envoy turns into a 5xx with ``failure_mode_allow:
false``. Nothing in the service answers "continue" on an error.
"""

from __future__ import annotations


class ExtProcError(Exception):
    """Base of every error the service raises on purpose."""

    status: int = 500
    error_type: str = "InternalServerError"

    def __init__(self, message: str, *, reason: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        # Short machine-readable cause, used in access-log details and decisions.
        self.reason = reason
        self.param = param


class HttpError(ExtProcError):
    """A request the service refuses; the client receives it as a JSON error."""

    # True for refusals that come from inspecting the request (the policy, the body's
    # format). Audit mode lets those requests pass and only reports them; limits,
    # timeouts and configuration errors are enforced in every mode.
    auditable = False


class BadRequest(HttpError):
    status = 400
    error_type = "BadRequestError"
    auditable = True


class UnsupportedMediaType(HttpError):
    status = 415
    error_type = "UnsupportedMediaTypeError"
    auditable = True


class PayloadTooLarge(HttpError):
    status = 413
    error_type = "PayloadTooLargeError"


class RequestTimeout(HttpError):
    status = 408
    error_type = "RequestTimeoutError"


class ServiceUnavailable(HttpError):
    """A transient refusal (the in-flight byte budget is exhausted); clients may retry."""

    status = 503
    error_type = "ServiceUnavailableError"
    retry_after_seconds = 1


class RoutePolicyError(HttpError):
    """The route's policy metadata is invalid: an operator error, so fail closed."""

    status = 500
    error_type = "InternalServerError"


class ProtocolError(ExtProcError):
    """Envoy sent a message the stream cannot accept in its current state."""
