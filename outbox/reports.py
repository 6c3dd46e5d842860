"""What a batch's delivery reports say about its rows: one pure classifier for both lanes
(docs/outbox-relay.md, "One batch").

A row is delivered (a report without an error), held (a stream row behind its key's slow-lane
head: never sent), refused (the broker will never take it as it is: an attempt is counted), or
unavailable (no report, or an error that says only that Kafka could not be reached: nothing is
wrong with the row, it is read again later)."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from confluent_kafka import KafkaError

from outbox.kafka_errors import broker_unavailable
from outbox.store import ReadMessage


@dataclass(frozen=True, slots=True)
class Delivery:
    """A row's delivery report."""

    error: KafkaError | None
    acked_at: float | None = None  # when the broker's acknowledgement came back (monotonic)


@dataclass(slots=True)
class Reports:
    """A batch's rows sorted by their reports, in the batch's order. With `stop_at_unavailable`
    only the rows before the first unavailable one are sorted (`settled` of them)."""

    settled: int = 0
    delivered: list[ReadMessage] = field(default_factory=list)
    # Each delivered row's age at its acknowledgement (seconds), when the report timed it.
    latencies: list[float] = field(default_factory=list)
    # Rows that leave for the slow lane, with the broker's refusal (None: held, never sent).
    detoured: list[tuple[ReadMessage, KafkaError | None]] = field(default_factory=list)
    unavailable: list[ReadMessage] = field(default_factory=list)
    first_unavailable: KafkaError | None = None  # the first unavailable row's error, if any

    @property
    def refused(self) -> list[tuple[ReadMessage, KafkaError]]:
        return [(m, e) for m, e in self.detoured if e is not None]


def sort_reports(messages: Sequence[ReadMessage], deliveries: dict[bytes, Delivery], *,
                 stop_at_unavailable: bool,
                 unavailable: Callable[[KafkaError], bool] = broker_unavailable) -> Reports:
    """Sort `messages` by their reports in `deliveries` (by message key: a batch has one row per
    key). The stream stops at the first unavailable row (its position cannot pass it); the slow
    lane sorts every row."""
    reports = Reports(settled=len(messages))
    for index, message in enumerate(messages):
        if message.held:
            reports.detoured.append((message, None))
            continue
        report = deliveries.get(message.key.encode())
        error = report.error if report else None
        if report is not None and error is None:
            reports.delivered.append(message)
            if report.acked_at is not None:  # its age when read, plus the time since
                reports.latencies.append(message.age_at_read_s + report.acked_at
                                         - message.read_at)
        elif error is None or unavailable(error):
            reports.first_unavailable = reports.first_unavailable or error
            if stop_at_unavailable:
                reports.settled = index
                break
            reports.unavailable.append(message)
        else:
            reports.detoured.append((message, error))
    return reports
