"""One error hierarchy for js-etl.

Every error the library raises derives from :class:`JsEtlError` and is *also* marked either
:class:`TransientError` (retrying the same run later may succeed: an unreachable server, a
leadership change, a pin held by another run) or :class:`TerminalError` (something must be
fixed first: bad config, a missing stream, wrong credentials). Retry logic is a type check::

    try:
        run()
    except TransientError:
        schedule_retry()

Server API errors are mapped by ``err_code`` in :mod:`js_etl.jetstream.errors`.
"""

from __future__ import annotations

import re


class JsEtlError(Exception):
    """Base of every js-etl error. ``str(err)`` is one line a user can act on."""

    exit_code = 1


def one_line(error: BaseException, limit: int = 400) -> str:
    """``Class: message`` of another library's error, for a js-etl error's one line: deltalake's
    (and the object store client's) text is a chain of causes, one per line, marked with terminal
    colour codes (``\x1b[31m↳\x1b[0m``); it is joined on one line without them, cut at
    ``limit`` characters."""
    return f"{type(error).__name__}: {joined_lines(str(error))}"[:limit]


def joined_lines(text: str) -> str:
    """``text``'s lines on one line, without terminal colour codes or ``↳`` markers."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    parts = [part.strip().lstrip("↳").strip() for part in text.splitlines()]
    return " ".join(p for p in parts if p)


class TransientError(JsEtlError):
    """Retrying later, unchanged, may succeed."""

    exit_code = 75  # EX_TEMPFAIL: schedulers treat it as "try again"


class TerminalError(JsEtlError):
    """Retrying unchanged will fail again: something must be fixed first."""

    exit_code = 2


class ConfigError(TerminalError):
    """The job configuration is invalid; the message names the key and the fix."""


class RunRefusedError(TransientError):
    """Another run holds this consumer; this run did nothing and may be retried later."""

    exit_code = 73


# --- backfill ranges and the rewind of a durable consumer --------------------------------------
class RangeError(ConfigError):
    """The requested range is empty, inverted, beyond the stream, or has no messages."""


class PurgedRangeError(TerminalError):
    """The range starts before the first message the stream still stores (purged or expired)."""


class StreamReplacedError(TerminalError):
    """The stream under a query's name is not the one its checkpoint read: deleted and created
    again, its sequences started over."""


class ConfirmationRequiredError(ConfigError):
    """A destructive admin command was not confirmed (no ``--yes`` and no terminal to ask on)."""


class RewindUnsupportedError(TerminalError):
    """The server cannot reset a consumer; the message carries the delete-and-recreate commands."""
