"""What a failed Spark job says, in one line and an exit code.

A js-etl error raised on an executor reaches the driver as text inside Spark's and Py4J's
exceptions; a JVM failure as a Java stack. Both are read back here into the reason a user sees
and the exit code a scheduler acts on (:mod:`js_etl.errors`).
"""

from __future__ import annotations

import re

from js_etl.errors import JsEtlError, TransientError, joined_lines

# Spark's words for an executor (or the blocks it held) gone mid-job: infrastructure, not input,
# so the run is transient (75) like a NATS outage. CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND is what a
# worker killed after a round's checkpoint gives on a standalone cluster; the fault point
# lose_checkpoint reproduces it in local mode (tests/drain/test_faults.py).
_EXECUTOR_LOST = ("CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND", "ExecutorLostFailure",
                  "FetchFailedException")
# The last line of a Python traceback that Spark carries back from an executor.
_EXECUTOR_ERROR = re.compile(r"^js_etl\.(?:\w+\.)*?(\w+): (.*)$")
# An object store's client giving up on a request the store failed or never answered, after its
# own retries: the Rust object_store crate of deltalake and obstore ("Generic S3 error: Error
# performing PUT … - Server returned non-2xx status code: 503 …", or "… HTTP error: error sending
# request" for a reset or a timeout) and the AWS SDK under Spark's S3A ("S3Exception: … (Service:
# S3, Status Code: 503, …)"). A 5xx, a 429 or a broken connection is the store's, or the
# network's, state: a later run may not meet it. A 4xx (no permission, no bucket) is not.
_STORE_CLIENT = re.compile(r"Generic \w+ error|\(Service: S3,")
_STORE_UNAVAILABLE = re.compile(r"status code: (?:5\d\d|429)\b|error sending request",
                                re.IGNORECASE)
# What Spark says when an executor's Python daemon could not start (it then quotes the daemon's
# stderr up to "PYTHONPATH was:"): seen with a PYSPARK_PYTHON that lacks pyarrow or js-etl.
_WORKER_START_FAILED = "Error from python worker:"


def failure_reason(error: BaseException) -> tuple[str, int]:
    """One line saying why, and the exit code. A js-etl error raised on an executor arrives
    wrapped in a Spark/Py4J exception, as traceback text: its class still decides the exit code
    (a NATS outage in a fetch task is transient, 75; a terminal error, 2, is not retried)."""
    import js_etl.jetstream.errors  # noqa: F401  (registers the JetStream error classes)

    classes = {cls.__name__: cls for cls in _subclasses(JsEtlError)}
    text = str(error)
    for line in reversed(text.splitlines()):
        match = _EXECUTOR_ERROR.match(line.strip())
        if match and match.group(1) in classes:
            return f"{match.group(1)}: {match.group(2)}", classes[match.group(1)].exit_code
    lost = next((m for m in _EXECUTOR_LOST if m in text), None)
    if lost:
        return (f"an executor was lost during the run ({lost}); nothing it held was acked, so "
                "the next run takes it up again", TransientError.exit_code)
    store = _store_unavailable(text)
    if store:
        return (f"the object store failed a request after its client's retries ({store}); "
                "nothing the run did not commit was acked, the next run takes it up again"
                ), TransientError.exit_code
    if _WORKER_START_FAILED in text:
        quoted = text.split(_WORKER_START_FAILED, 1)[1].split("PYTHONPATH was:", 1)[0]
        last = ([line.strip() for line in quoted.splitlines() if line.strip()] or ["?"])[-1]
        return (f"the executors' Python could not start a worker: {last} (the workers' Python, "
                "PYSPARK_PYTHON or spark-submit's spark.pyspark.python, must have js-etl and "
                "its dependencies)")[:500], 1
    lines = text.strip().splitlines() or [""]
    if "Traceback (most recent call last)" in text:  # an executor's Python error: its last line
        return lines[-1].strip()[:500], 1
    java = java_root_cause(text)
    if java:
        return java[:500], 1
    return f"{type(error).__name__}: {lines[0]}"[:500], 1


def _store_unavailable(text: str) -> str | None:
    """What the object store's client said, in one line, where it gave up on a store that
    failed or could not be reached (:data:`_STORE_UNAVAILABLE`); else None."""
    client = _STORE_CLIENT.search(text)
    if client is None or not _STORE_UNAVAILABLE.search(text):
        return None
    if client.group().startswith("(Service"):  # the AWS SDK's exception: its Java root cause
        return (java_root_cause(text) or "")[:300] or None
    # The object_store crate's text, to the error body (an XML document) or a blank line.
    said = re.split(r"<\?xml|\n\s*\n", text[client.start():], maxsplit=1)[0]
    return joined_lines(said).rstrip(": ")[:300]


def java_root_cause(text: str) -> str | None:
    """``Class: message`` of the innermost Java exception in a Py4J error's text (its last
    ``Caused by:``, else the exception the call raised), the package left off; None when the text
    holds no Java exception. Py4J's own first line only names the JVM object that was called."""
    causes = [line.strip()[len("Caused by: "):] for line in text.splitlines()
              if line.strip().startswith("Caused by: ")]
    if not causes:
        causes = [line[2:] for line in text.splitlines() if line.startswith(": ")]
    if not causes:
        return None
    name, _, message = causes[-1].partition(": ")
    return f"{name.rsplit('.', 1)[-1]}: {message.strip()}" if message else name.rsplit(".", 1)[-1]


def is_transient(error: BaseException) -> bool:
    """A failure a later attempt may not meet (a NATS outage on an executor, a lost executor)."""
    return isinstance(error, TransientError) or failure_reason(error)[1] == TransientError.exit_code


def _subclasses(cls: type[JsEtlError]) -> list[type[JsEtlError]]:
    return [sub for direct in cls.__subclasses__() for sub in (direct, *_subclasses(direct))]
