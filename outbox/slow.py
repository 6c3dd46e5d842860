"""The slow lane (docs/outbox-relay.md, "The slow lane"): detoured rows delivered one per key at
a time, each the oldest waiting row of its key, and marked published; an undeliverable row gets
an attempt counted and a retry delay, and is parked after `max_attempts`; a row its partition
could not take now gets its partition's retry delay and no attempt (it is never parked for it);
a row whose topic is not on OUTBOX_TOPICS is never sent and parked at once.

A row whose earlier attempt may already be on the topic goes to the patient producer, which is
not waited for (outbox.producer): the lane records its report at a later turn, and meanwhile
neither sends the row again nor lets its key's later rows by."""

import time
import uuid

from outbox import metrics, store
from outbox.producer import PatientReport, RelayProducer, Reports, sort_reports
from outbox.retries import Retries
from outbox.store import Read
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
        """One batch of the slow lane: the patient producer's reports that came, then its due
        rows, each the oldest waiting row of its key (the rows of a partition that came back
        are due at once)."""
        outcome = self._record_patient_reports()
        store.make_due(self.using, self._retries.partitions.take_due())
        read = store.read_slow(self.using, batch_size=self.batch_size)
        patient = self._producer.patient
        rows = [m for m in read.messages if not patient.holds(m.id)]  # still on its way
        if not rows:
            return outcome
        batch = self._producer.produce_batch(Read(rows, read.read_at))
        self._producer.await_batch(batch)
        sent = [m for m in batch.read if m.key not in batch.patient]
        reports = sort_reports(sent, batch.errors, acked_at=batch.acked_at,
                               read_at=batch.read_at, stop_at_unavailable=False,
                               off_allowlist=batch.off_allowlist)
        self._producer.record_patient(batch, reports, stream=False)
        outcome.merge(self._record(reports, batch.partitions, read=len(batch.read)))
        return outcome

    def _record_patient_reports(self) -> BatchOutcome:
        """The reports of rows the patient producer had on their way, as a batch of their own
        (a report that came within the delivery timeout says its partition is back)."""
        patient = self._producer.patient
        patient.serve()
        came: list[PatientReport] = patient.slow_lane_reports()
        if not came:
            return BatchOutcome()
        now = time.monotonic()
        reports = sort_reports([r.message for r in came],
                               {r.message.key: r.error for r in came if r.error is not None},
                               acked_at=now, read_at=now, stop_at_unavailable=False)
        reports.latencies = []  # their age is not the relay's batch's
        for report in came:
            if report.error is None and report.in_time:
                self._producer.topics.answered_in_time(report.message.topic, report.partition)
        in_time = {r.message.id for r in came if r.error is None and r.in_time}
        return self._record(reports, {r.message.key: r.partition for r in came}, read=0,
                            back=[m.key for m in reports.delivered if m.id in in_time])

    def _record(self, reports: Reports, partitions: dict[str, int], *, read: int,
                back: list[str] | None = None) -> BatchOutcome:
        """Record a batch's sorted rows: marked published, given an attempt, delayed."""
        failures = [store.Failure(m.id, *self._retries.describe_refusal(m, error))
                    for m, error in reports.refused]
        deferrals = self._retries.describe_deferrals(reports.deferred, partitions)
        metrics.observe_delivery_latencies(reports.latencies)
        outcome = BatchOutcome(read=read)
        outcome.published = store.mark_published(self.using, [m.id for m in reports.delivered])
        self._retries.delivered(m.key for m in reports.delivered if back is None or m.key in back)
        outcome.released = len(reports.unavailable)  # left unpublished: read again next time
        outcome.failed = len(failures)
        outcome.deferred = store.postpone(
            self.using, [store.Failure(i, *deferred) for i, deferred in deferrals.items()])
        outcome.parked = store.record_failures(self.using, failures, self.max_attempts)
        off_allowlist = store.park(self.using, {m.id: why for m, why in reports.off_allowlist})
        topics = {uuid.UUID(m.id): m.topic for m, _why in reports.off_allowlist}
        outcome.parked += off_allowlist
        outcome.off_allowlist = {i: topics[i] for i in off_allowlist}
        self._producer.batch_recorded(published=outcome.published, released=outcome.released,
                                      first_unavailable=reports.first_unavailable)
        return self._tally.account(outcome, lane="slow", max_attempts=self.max_attempts)
