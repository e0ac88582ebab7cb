"""JetStream errors: server API errors mapped by ``err_code``, pull statuses mapped by code.

Each class is marked transient or terminal by inheritance (see :mod:`js_etl.errors`), so a
caller decides to retry with ``isinstance(err, TransientError)``.
"""

from __future__ import annotations

from typing import Any, Self

from js_etl.errors import JsEtlError, TerminalError, TransientError


class JetStreamError(JsEtlError):
    """A JetStream API error answer or an error status of a pull."""

    def __init__(self, description: str, *, code: int = 0, err_code: int = 0) -> None:
        self.description = description
        self.code = code
        self.err_code = err_code
        detail = f" (code {code}" + (f", err_code {err_code})" if err_code else ")") if code else ""
        super().__init__(f"{description}{detail}")

    def with_hint(self, hint: str) -> Self:
        """The same error (type, codes), its description followed by ``; <hint>``: how the
        caller's own settings fix it, which this layer does not know."""
        return type(self)(f"{self.description}; {hint}", code=self.code, err_code=self.err_code)


# --- connection level -------------------------------------------------------------------------
class NatsUnavailableError(JetStreamError, TransientError):
    """No server answered: unreachable, refused, timed out, or JetStream not ready (503)."""


class AuthorizationError(JetStreamError, TerminalError):
    """The server refused the credentials, or the user may not use this subject."""


class TlsError(JetStreamError, TerminalError):
    """TLS cannot be had: the server's certificate does not verify, or a server without TLS
    was asked for it. Retrying unchanged fails the same way, so it is terminal."""


class JetStreamNotEnabledError(JetStreamError, TerminalError):
    """JetStream is not enabled on the server or for the account."""


# --- API answers (mapped by err_code) -----------------------------------------------------------
class StreamNotFoundError(JetStreamError, TerminalError):
    pass


class ConsumerNotFoundError(JetStreamError, TerminalError):
    pass


class ConsumerUnavailableError(JetStreamError, TransientError):
    """No consumer answered a pull (503): its leader is being elected, or it was deleted —
    only its info (404 once JetStream answers) tells the two apart."""


class ConsumerExistsError(JetStreamError, TerminalError):
    """A consumer of that name exists with a different configuration."""


class BadRequestError(JetStreamError, TerminalError):
    """The server rejected a request (bad JSON, bad field value, priority-group misuse …)."""


class PriorityGroupError(BadRequestError):
    """The pull's priority group is missing, unknown, or the wrong kind for the consumer."""


class ConsumerConfigError(JetStreamError, TerminalError):
    """An existing consumer cannot serve a drain; the message says what to change."""


class WrongLastSequenceError(JetStreamError, TerminalError):
    """A publish expected another last sequence for its subject: someone else wrote first."""


class ClusterUnavailableError(JetStreamError, TransientError):
    """Leadership change, no quorum, request timed out on the server side."""


# --- pull statuses ------------------------------------------------------------------------------
class ConsumerDeletedError(JetStreamError, TerminalError):
    """409 Consumer Deleted: the consumer went away while a pull waited."""


class PullLimitError(JetStreamError, TerminalError):
    """409 Exceeded MaxRequestBatch / MaxRequestMaxBytes / MaxRequestExpires / MaxWaiting."""


class PinMismatchError(JetStreamError, TransientError):
    """423: another client holds the pin of this priority group (or our pin id is stale)."""


# Server err_codes (nats-server errors.json), and the classes they map to.
_BY_ERR_CODE: dict[int, type[JetStreamError]] = {
    10059: StreamNotFoundError,       # stream not found
    10014: ConsumerNotFoundError,     # consumer not found
    10013: ConsumerExistsError,       # consumer name already in use
    10148: ConsumerExistsError,       # consumer already exists (action=create)
    10105: ConsumerExistsError,       # consumer already exists and is still active
    10039: JetStreamNotEnabledError,  # not enabled for account
    10076: JetStreamNotEnabledError,  # not enabled
    10003: BadRequestError,
    10025: BadRequestError,           # invalid JSON (also: unknown priority policy)
    10159: BadRequestError,           # priority policy without groups
    10160: PriorityGroupError,        # group does not exist for this consumer
    10196: BadRequestError,           # groups with policy none
    10071: WrongLastSequenceError,    # wrong last sequence: N (an expected-sequence publish)
    10164: WrongLastSequenceError,    # wrong last sequence (the same, as a clustered stream says)
    10008: ClusterUnavailableError,   # cluster not available
    10077: ClusterUnavailableError,   # consumer/stream leadership changing
}
_BY_CODE: dict[int, type[JetStreamError]] = {
    400: BadRequestError,
    403: AuthorizationError,
    404: ConsumerNotFoundError,
    408: ClusterUnavailableError,
    500: ClusterUnavailableError,
    503: NatsUnavailableError,
}


def api_error(error: dict[str, Any]) -> JetStreamError:
    """Turn a JSON API ``error`` object into the matching typed exception."""
    code = int(error.get("code", 0))
    err_code = int(error.get("err_code", 0))
    cls = _BY_ERR_CODE.get(err_code) or _BY_CODE.get(code) or ClusterUnavailableError
    return cls(str(error.get("description", "unknown JetStream error")), code=code,
               err_code=err_code)
