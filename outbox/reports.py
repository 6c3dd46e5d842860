"""What a batch's delivery reports say about its rows: one pure classifier for both lanes
(docs/outbox-relay.md, "One batch").

A row is delivered (no error reported, in a batch the producer acknowledged as a whole), held (a
stream row behind its key's slow-lane head: never sent), off the allowlist (its topic is not on
OUTBOX_TOPICS: never sent, parked at once), refused (the broker will never take it
as it is: an attempt is counted), deferred (its partition could not take it now while the
cluster took others: it waits in the slow lane, no attempt counted), or unavailable (not
acknowledged, or an error that says only that Kafka could not be reached: nothing is wrong with
the row, it is read again later)."""

from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from confluent_kafka import KafkaError

from outbox.kafka import broker_unavailable, local_timeout, partition_unavailable
from outbox.store import ReadMessage


@dataclass(slots=True)
class Reports:
    """A batch's rows sorted by their reports, in the batch's order. With `stop_at_unavailable`
    only the rows before the first unavailable one are sorted (`settled` of them)."""

    settled: int = 0
    delivered: list[ReadMessage] = field(default_factory=list)
    # The delivered rows' ages at the batch's acknowledgement: (seconds, rows) pairs, one for
    # each created_at (a writer's transaction stamps all its rows with one).
    latencies: list[tuple[float, int]] = field(default_factory=list)
    # Rows that leave for the slow lane, with the broker's refusal (None: held, never sent).
    detoured: list[tuple[ReadMessage, KafkaError | None]] = field(default_factory=list)
    # Rows whose partition could not take them now (no leader, not enough replicas, timed out)
    # in a batch the cluster otherwise took: they leave for the slow lane, no attempt counted.
    deferred: list[tuple[ReadMessage, KafkaError]] = field(default_factory=list)
    unavailable: list[ReadMessage] = field(default_factory=list)
    # Rows never sent because their topic is not on OUTBOX_TOPICS, with why: parked at once.
    off_allowlist: list[tuple[ReadMessage, str]] = field(default_factory=list)
    first_unavailable: KafkaError | None = None  # the first unavailable row's error, if any

    @property
    def refused(self) -> list[tuple[ReadMessage, KafkaError]]:
        return [(m, e) for m, e in self.detoured if e is not None]


def sort_reports(messages: Sequence[ReadMessage], errors: Mapping[str, KafkaError], *,
                 acked_at: float | None, read_at: float, stop_at_unavailable: bool,
                 unavailable: Callable[[KafkaError], bool] = broker_unavailable,
                 unsent: Collection[str] = (),
                 off_allowlist: Mapping[str, str] | None = None,
                 cluster_answers: Callable[[], bool] = lambda: True) -> Reports:
    """Sort `messages` by the `errors` reported for them (by message key: a batch has one row
    per key) and the batch's acknowledgement (`acked_at`, monotonic; None: the batch was not
    acknowledged, so a row without an error report is not known to be delivered). The stream
    stops at the first unavailable row (its position cannot pass it); the slow lane sorts every
    row. A row's latency is its age when read (`read_at`) plus the time to the acknowledgement
    of its batch.

    A partition's outage is told from the broker's by the batch itself: a row with a
    partition-level error (`partition_unavailable`) is deferred when the batch was acknowledged
    and the stream's batch had a row delivered (the cluster answers; that partition does not);
    in a batch with nothing delivered it is unavailable and the stream stops before it, as for
    a broker that cannot be reached. The slow lane defers such a row whatever the rest did
    (its rows are detoured already: nothing floods, and the stream judges the broker). Rows
    `unsent` (keys: kept back because the topic's metadata showed their partition unable to
    take them) are no answer of the cluster: a stream batch with nothing delivered stops before
    them as well, so that a topic whose every partition is short of in-sync replicas stops the
    stream instead of detouring it row by row. Rows `off_allowlist` (keys: why) were never sent:
    they are sorted apart, in their place, whatever the rest did.

    A row that timed out in this client (`local_timeout`) beside delivered rows may be a broker
    that died halfway through the batch, not its partition: the stream defers it only if
    `cluster_answers()` (asked then, once: a metadata request) says a broker answers now."""
    reports = Reports(settled=len(messages))
    off_allowlist = off_allowlist or {}
    if (acked_at is not None and not errors and not off_allowlist
            and not any(m.held for m in messages)):
        reports.delivered = list(messages)  # the usual batch: every row delivered
    else:
        acked = acked_at is not None
        sent = [m for m in messages
                if not m.held and m.key not in unsent and m.key not in off_allowlist]
        answered = acked and (not stop_at_unavailable or any(m.key not in errors for m in sent))
        if answered and stop_at_unavailable and any(
                partition_unavailable(e) and local_timeout(e)
                for e in (errors[m.key] for m in sent if m.key in errors)):
            answered = cluster_answers()
        _sort_each(reports, messages, errors, acked=acked, defer=answered,
                   stop_at_unavailable=stop_at_unavailable, unavailable=unavailable,
                   off_allowlist=off_allowlist)
    if acked_at is not None and reports.delivered:
        since_read = acked_at - read_at
        clock_s = reports.delivered[0].clock_s  # one read: one clock
        reports.latencies = [(max(0.0, clock_s - created_ms / 1000) + since_read, rows)
                             for created_ms, rows in
                             Counter(m.timestamp_ms for m in reports.delivered).items()]
    return reports


def _sort_each(reports: Reports, messages: Sequence[ReadMessage],
               errors: Mapping[str, KafkaError], *, acked: bool, defer: bool,
               stop_at_unavailable: bool, unavailable: Callable[[KafkaError], bool],
               off_allowlist: Mapping[str, str]) -> None:
    for index, message in enumerate(messages):
        if message.held:
            reports.detoured.append((message, None))
            continue
        if message.key in off_allowlist:
            reports.off_allowlist.append((message, off_allowlist[message.key]))
            continue
        error = errors.get(message.key)
        if error is None and acked:
            reports.delivered.append(message)
        elif error is not None and defer and partition_unavailable(error):
            reports.deferred.append((message, error))
        elif error is None or unavailable(error):
            reports.first_unavailable = reports.first_unavailable or error
            if stop_at_unavailable:
                reports.settled = index
                return
            reports.unavailable.append(message)
        else:
            reports.detoured.append((message, error))
