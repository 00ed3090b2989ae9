"""Refusals as values, and the one error hierarchy that produces them.

A ``Refusal`` is what the client is told when a request is refused: a frozen value
(status, type, reason, message, param) that decisions and answers carry. Exceptions
exist only between the place that detects a problem while parsing or validating
(``HttpError`` subclasses) and ``attempt``, the one place they become values; no
exception is ever kept. A ``ProtocolError`` (Envoy broke the
ext_proc message order) is not a refusal: it ends the gRPC stream with an error, which
Envoy turns into a 5xx with ``failure_mode_allow: false``. Nothing in the service
answers "continue" on an error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Final, ParamSpec, TypeVar

from ext_proc.core.reasons import Reason

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the service refuses; the client receives it as a JSON error."""

    status: int
    error_type: str
    # Short machine-readable cause, used in access-log details, metrics and logs.
    reason: Reason
    message: str
    param: str | None = None
    # True for refusals that come from inspecting the request (the policy, the body's
    # format). Audit mode lets those requests pass and only reports them; limits,
    # timeouts and configuration errors are enforced in every mode.
    auditable: bool = False
    # Seconds a client should wait before retrying (a transient refusal), or None.
    retry_after: int | None = None
    # What the operator's log says about a refusal whose client message is only its
    # reason (the gateway's own faults); never sent to the client.
    detail: str | None = None


class ExtProcError(Exception):
    """Base of every error the service raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class HttpError(ExtProcError):
    """Raised where a request is found unacceptable; converted by ``refusal()``."""

    status: ClassVar[int] = 500
    error_type: ClassVar[str] = "InternalServerError"
    auditable: ClassVar[bool] = False
    retry_after: ClassVar[int | None] = None
    # The gateway's own fault: the client is told the reason code only (its message and
    # param name the deployment's internals), the log keeps the message as the detail.
    internal: ClassVar[bool] = False

    def __init__(self, message: str, *, reason: Reason, param: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.param = param

    def refusal(self) -> Refusal:
        if self.internal:
            return Refusal(
                self.status,
                self.error_type,
                self.reason,
                str(self.reason),
                None,
                self.auditable,
                self.retry_after,
                detail=self.message,
            )
        return Refusal(
            self.status,
            self.error_type,
            self.reason,
            self.message,
            self.param,
            self.auditable,
            self.retry_after,
        )


class BadRequest(HttpError):
    status = 400
    error_type = "BadRequestError"
    auditable = True


@functools.lru_cache(maxsize=1024)
def bad_request(message: str, *, reason: Reason, param: str | None = None) -> Refusal:
    """``BadRequest(...).refusal()``, without building the exception (one per denied
    request). A refusal is a frozen value of its arguments alone, so requests refused
    alike share one (a bounded cache: a client varying its refusal's message only
    replaces entries), and what is built from it may be kept with it."""
    return Refusal(
        BadRequest.status,
        BadRequest.error_type,
        reason,
        message,
        param,
        BadRequest.auditable,
        BadRequest.retry_after,
    )


class Unauthorized(HttpError):
    """The route serves identified tenants only, and the request names none."""

    status = 401
    error_type = "UnauthorizedError"
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
    """A transient refusal (the in-flight byte budget is exhausted, the record of spent
    proofs cannot be consulted); clients may retry."""

    status = 503
    error_type = "ServiceUnavailableError"
    retry_after = 1


# A proof the record of spent proofs could not be consulted for
# (``replay.Verdict.UNAVAILABLE``; not ``PREDATES``, which no retry changes).
# No finding about the request: refused in every mode, never forwarded without the proof
# (its decode would recompute what the proof lets it read). The client is told what it
# can act on, nothing of the deployment.
RECORD_UNAVAILABLE: Final = ServiceUnavailable(
    "the record of spent proofs does not answer for this proof now; retry the request",
    reason=Reason.PROOF_RECORD_UNAVAILABLE,
).refusal()


class RoutePolicyError(HttpError):
    """The route's policy metadata is invalid: an operator error, so fail closed."""

    status = 500
    error_type = "InternalServerError"
    internal = True


class ProtocolError(ExtProcError):
    """Envoy sent a message the stream cannot accept in its current state. It carries no
    reason: it is no outcome (the edge counts it as a stream error, and its message is
    the gRPC status's)."""

    # The request's x-request-id, when the stream knew it (for the edge's log line).
    request_id: str = ""


def attempt(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | Refusal:
    """``call``'s result, or the refusal it raised: the one place an ``HttpError``
    becomes a value. The exception is dropped here, so no traceback (which references
    the stream and the body) outlives the call."""
    try:
        return call(*args, **kwargs)
    except HttpError as exc:
        return exc.refusal()
