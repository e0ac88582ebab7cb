"""A drain run's hold on the pin of a ``pinned_client`` priority group (NATS ADR-42).

Only a delivery takes the pin (a pull answered only with a 409 does not), so a pinned run's
first round pulls on one partition and later rounds share the pin id it was given. Between
rounds the run checks it still holds the pin; at its end it releases it (UNPIN) rather than
leaving the next run to wait for ``priority_timeout``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from js_etl.errors import RunRefusedError

if TYPE_CHECKING:
    from js_etl.jetstream.api import ConsumerInfo
    from js_etl.jetstream.sync import JetStreamSession

log = logging.getLogger("js_etl.drain")


class GroupPin:
    """The pin this run holds (``pin_id``) on ``group`` of ``stream``/``consumer``; inert unless
    ``pinned`` (the consumer uses a ``pinned_client`` group)."""

    def __init__(self, stream: str, consumer: str, group: str | None) -> None:
        self.stream = stream
        self.consumer = consumer
        self.group = group or ""
        self.pinned = False  # the consumer uses a pinned_client group
        self.pin_id: str | None = None  # our pin, once the server gave us one

    def take_over(self, js: JetStreamSession, info: ConsumerInfo,
                  previous_pin_id: str | None) -> None:
        """Before the first round: free the pin of the dead run whose lock this run took over
        (``previous_pin_id``); refuse to run while another client holds it."""
        if not self.pinned:
            return
        holder = info.pinned_id(self.group)
        if holder is None:
            return
        if previous_pin_id == holder:
            # The pin belongs to the dead run whose lock we took over: free it now rather than
            # waiting for priority_timeout.
            js.run(js.admin.unpin(self.stream, self.consumer, self.group))
            return
        raise RunRefusedError(f"consumer {self.stream}/{self.consumer} is pinned "
                              f"by another client ({holder}); this run would split its stream")

    def changed(self, js: JetStreamSession, got_messages: bool) -> bool:
        """After a round on a pinned consumer: learn our pin, or find we lost it."""
        info = js.consumer_info(self.stream, self.consumer)
        holder = info.pinned_id(self.group)
        if got_messages and self.pin_id is None:
            self.pin_id = holder  # our single-partition round took the pin
            return False
        if holder is not None and holder != self.pin_id:
            raise RunRefusedError(f"consumer {self.stream}/{self.consumer} is "
                                  f"pinned by another client ({holder})")
        if holder is None and self.pin_id is not None:
            self.pin_id = None
            return True
        return False

    def release(self, js: JetStreamSession) -> None:
        if not (self.pinned and self.pin_id):
            return
        # Any failure is only logged: the pin times out on its own; do not mask the run's outcome.
        try:
            js.run(js.admin.unpin(self.stream, self.consumer, self.group))
        except Exception as e:
            log.warning("could not unpin %s: %s", self.consumer, e)
