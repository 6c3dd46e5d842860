"""The slow lane (docs/outbox-relay.md, "The slow lane"): detoured rows delivered one per key at
a time, each the oldest waiting row of its key, and marked published; an undeliverable row gets
an attempt counted and a retry delay, and is parked after `max_attempts`; a row its partition
could not take now gets its partition's retry delay and no attempt (it is never parked for it)."""

from outbox import metrics, store
from outbox.producer import RelayProducer
from outbox.reports import sort_reports
from outbox.retries import Retries
from outbox.tally import BatchOutcome, Tally


class SlowLane:
    """The slow lane of one relay, run by its leader."""

    def __init__(self, using: str, *, batch_size: int, max_attempts: int,
                 producer: RelayProducer, retries: Retries, tally: Tally) -> None:
        self.using = using
        self.batch_size = batch_size
        self.max_attempts = max_attempts
        self._producer = producer
        self._retries = retries
        self._tally = tally

    def publish(self) -> BatchOutcome:
        """One batch of the slow lane: its due rows, each the oldest waiting row of its key
        (the rows of a partition that came back are due at once)."""
        store.make_due(self.using, self._retries.partitions.take_due())
        read = store.read_slow(self.using, batch_size=self.batch_size)
        if not read.messages:
            return BatchOutcome()
        batch = self._producer.produce_batch(read)
        self._producer.await_batch(batch)
        reports = sort_reports(batch.read, batch.errors, acked_at=batch.acked_at,
                               read_at=batch.read_at, stop_at_unavailable=False)
        failures = [store.Failure(m.id, *self._retries.describe_refusal(m, error))
                    for m, error in reports.refused]
        deferrals = self._retries.describe_deferrals(reports.deferred, batch.partitions)
        metrics.observe_delivery_latencies(reports.latencies)
        outcome = BatchOutcome(read=len(batch.read))
        outcome.published = store.mark_published(self.using, [m.id for m in reports.delivered])
        self._retries.delivered(m.key for m in reports.delivered)
        outcome.released = len(reports.unavailable)  # left unpublished: read again next time
        outcome.failed = len(failures)
        outcome.deferred = store.postpone(
            self.using, [store.Failure(i, *deferred) for i, deferred in deferrals.items()])
        outcome.parked = store.record_failures(self.using, failures, self.max_attempts)
        self._producer.batch_recorded(published=outcome.published, released=outcome.released,
                                      first_unavailable=reports.first_unavailable)
        return self._tally.account(outcome, lane="slow", max_attempts=self.max_attempts)
