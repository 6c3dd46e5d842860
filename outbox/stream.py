"""The stream lane (docs/outbox-relay.md, "One batch"): batches read after the position, in the
order their transactions wrote them, produced while the batch before awaits its reports, and
recorded in order, each by one transaction that moves the position past it (store.advance).

A batch ends before a key it already has or one still in flight (`cut`: one row per key in
flight at a time). A row the broker refused, a row its partition could not take while the
cluster took others (deferred), and every later row of its key, leave the stream for the slow
lane (they are "detoured"). If the broker could not take a row (nothing of the batch delivered),
the position stops just before it and the rest is read again: the next batch is then a probe,
cut past the keys it already has (their later rows held behind their head, not ending it), so
that a head row its partition cannot take does not make every batch that one row."""

import logging
import threading
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from outbox import metrics, store
from outbox.config import Emit
from outbox.held import HeldWatch
from outbox.leadership import Leadership
from outbox.producer import Batch, RelayProducer, Reports, sort_reports
from outbox.reader import StreamReader
from outbox.retries import Retries
from outbox.store import Position, Read, ReadMessage
from outbox.tally import BatchOutcome, Tally

# Batches in flight at once: the next read overlaps the previous batch's delivery wait.
PIPELINE_DEPTH = 2
# Stream batches per publish call, so that the slow lane gets its turn in a long run.
STREAM_BATCHES_PER_CALL = 20


def cut(read: list[ReadMessage], busy: Iterable[str],
        held: frozenset[str] | set[str] = frozenset(), *,
        probe: frozenset[str] | set[str] = frozenset()) -> list[ReadMessage]:
    """The batch in `read`: up to the first row whose key is `busy` (in flight) or already in
    the batch, so that order per key holds whatever the broker does with each. A row of a
    `held` key (detoured since the read began) is held, as the read says of a key the slow lane
    holds. A probe batch (after one that delivered nothing; `probe`: the keys that got no
    answer) goes on past those keys: their later rows are held (detoured behind their head,
    whatever becomes of it), so that the batch carries other keys' rows, and the cluster's
    answer tells a partition's outage from the broker's."""
    keys = set(busy)
    if probe:
        return _probe_cut(read, keys, held, probe)
    for index, message in enumerate(read):
        if message.key in keys:
            read = read[:index]
            break
        keys.add(message.key)
    if held:
        read = [m._replace(held=True) if m.key in held and not m.held else m for m in read]
    return read


def _probe_cut(read: list[ReadMessage], busy: set[str], held: frozenset[str] | set[str],
               probe: frozenset[str] | set[str]) -> list[ReadMessage]:
    batch: list[ReadMessage] = []
    keys: set[str] = set()
    for message in read:
        if message.key in busy or (message.key in keys and message.key not in probe):
            break
        repeated = (message.key in keys or message.key in held) and not message.held
        batch.append(message._replace(held=True) if repeated else message)
        keys.add(message.key)
    return batch


def position_after(batch: Batch, outcome: BatchOutcome) -> Position | None:
    """Where the stream's position is after a recorded batch (None if it did not move)."""
    recorded = len(batch.read) - outcome.released
    if recorded <= 0:
        return None
    return batch.read[recorded - 1].position


@dataclass(slots=True)
class StreamRun:
    """A run of stream batches: the position recorded, where the next read starts (past the
    batches in flight), and the batches in flight."""

    position: Position
    after: Position = ("0", 0)
    in_flight: deque[Batch] = field(default_factory=deque)
    reading: bool = True
    batches: int = 0
    # Keys this run detoured: held from then on, whatever a read started before said.
    detoured: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.after = self.position


class StreamLane:
    """The stream of one relay, run by its leader."""

    def __init__(self, using: str, *, max_attempts: int, producer: RelayProducer,
                 reader: StreamReader, leadership: Leadership, retries: Retries, tally: Tally,
                 held: HeldWatch, stop: threading.Event, emit: Emit) -> None:
        self.using = using
        self._emit = emit
        self.max_attempts = max_attempts
        self._producer = producer
        self._reader = reader
        self._leadership = leadership
        self._retries = retries
        self._tally = tally
        self._held = held
        self._stop = stop
        # The keys of the last batch recorded if it delivered nothing and stopped before them:
        # the next run's first batch is a probe past them (`cut`).
        self._probe: frozenset[str] = frozenset()

    def read(self, after: Position, busy: Iterable[str] = (),
             held: frozenset[str] | set[str] = frozenset(), *,
             probe: frozenset[str] | set[str] = frozenset()) -> Read:
        """The next batch after `after` (see `cut`)."""
        read = self._reader.read(after)
        return Read(cut(read.messages, busy, held, probe=probe), read.read_at)

    def publish(self, total: BatchOutcome) -> BatchOutcome:
        """Stream batches until a read comes back empty, the broker is unavailable, stop, or
        STREAM_BATCHES_PER_CALL batches; the next batch is read (after the previous one) and
        produced while the previous one awaits its delivery reports. A batch is recorded only
        once the batch before it moved the position to where it starts; otherwise its rows are
        read again by the next call. Raises KafkaRefusedError once every batch is accounted for."""
        run = StreamRun(store.read_position(self.using))
        try:
            return self._run(run, total)
        finally:
            self._reader.drop()  # a read ahead is not reused: the slow lane runs in between

    def _run(self, run: StreamRun, total: BatchOutcome) -> BatchOutcome:
        while True:
            self._fill(run)
            if not run.in_flight:
                return total
            batch = run.in_flight.popleft()
            if batch.start != run.position:  # the batch before it stopped short
                self._drop_unrecorded(batch)
                outcome = BatchOutcome(read=len(batch.read), released=len(batch.read))
                self._tally.unrecorded(outcome)
            else:
                try:
                    outcome = self.finish(batch, run.position, run.detoured)
                except store.PositionMovedError as exc:
                    self._stand_down(exc, run.in_flight)
                    return total
                run.position = position_after(batch, outcome) or run.position
            total.merge(outcome)
            if outcome.broker_unavailable:
                run.reading = False
            if self._producer.refused and not run.in_flight:
                self._producer.check_refused()  # every batch in flight accounted for first

    def _fill(self, run: StreamRun) -> None:
        """Read and produce stream batches until PIPELINE_DEPTH are in flight (or nothing more
        can be read now)."""
        while (run.reading and len(run.in_flight) < PIPELINE_DEPTH
               and not self._stop.is_set() and not self._producer.refused):
            if run.batches >= STREAM_BATCHES_PER_CALL:
                run.reading = False
                return
            busy = set().union(*(b.keys for b in run.in_flight))
            read = self.read(run.after, busy, run.detoured,
                             probe=self._probe if run.batches == 0 else frozenset())
            if not read.messages:
                # Nothing after `after`, or its first row's key is in flight: read on once a
                # batch in flight is done (if none is, there is nothing to read).
                run.reading = bool(run.in_flight)
                if not run.in_flight and run.batches == 0:
                    self._look_for_a_held_stream(run.after)
                return
            self._held.moving()
            start, run.after = run.after, read.messages[-1].position or run.after
            run.batches += 1
            if run.batches < STREAM_BATCHES_PER_CALL:
                self._reader.read_ahead(run.after)  # while this batch is produced
            run.in_flight.append(self._producer.produce_batch(read, start))

    def _look_for_a_held_stream(self, after: Position) -> None:
        """Nothing to read: held if rows wait after the position all the same (a transaction
        older than theirs is still open somewhere on the server)."""
        if store.stream_waiting(self.using, after):
            self._held.held()
        else:
            self._held.moving()

    def _stand_down(self, exc: store.PositionMovedError, in_flight: deque[Batch]) -> None:
        """Another relay moved the stream: this one no longer leads (what it sent since is
        delivered again by the leader, at least once)."""
        self._emit(logging.ERROR, "stream position moved by another relay, standing by",
                   {"error": str(exc)})
        for batch in in_flight:
            self._drop_unrecorded(batch)
        self._leadership.resign()

    def _drop_unrecorded(self, batch: Batch) -> None:
        """A batch read past a position that stopped short: wait for its reports all the same
        (nothing of it is recorded; what was delivered is sent again, at least once, and a row
        its attempt may have left on the topic goes to the patient producer then)."""
        self._producer.await_batch(batch)
        self._producer.record_patient(batch, Reports(settled=0), stream=True)

    def finish(self, batch: Batch, start: Position,
               detoured_keys: set[str] | None = None) -> BatchOutcome:
        """Await a stream batch's reports, then move the position past every row accounted for:
        delivered, refused (detoured with an attempt counted), deferred (detoured with a retry
        delay, no attempt counted) or held (detoured); it stops before the first row the broker
        could not take (or that the stop released)."""
        self._producer.await_batch(batch)
        self._producer.await_patient(batch)
        reports = sort_reports(batch.read, batch.errors, acked_at=batch.acked_at,
                               read_at=batch.read_at, stop_at_unavailable=True,
                               unsent=batch.unsent, off_allowlist=batch.off_allowlist,
                               cluster_answers=self._producer.cluster_answers)
        detours = [store.Detour(m.id) if error is None else
                   store.Detour(m.id, *self._retries.describe_refusal(m, error))
                   for m, error in reports.detoured]
        failed = len(detours) - sum(1 for d in detours if d.error is None)
        deferrals = self._retries.describe_deferrals(reports.deferred, batch.partitions)
        detours += [store.Detour(m.id, *deferrals[m.id], attempted=False)
                    for m, _error in reports.deferred]
        detours += [store.Detour(m.id, why, attempted=False, park=True)
                    for m, why in reports.off_allowlist]
        recorded = reports.settled
        outcome = BatchOutcome(read=len(batch.read),  # the rows not recorded are read again
                               published=len(reports.delivered),
                               released=len(batch.read) - recorded,
                               failed=failed, deferred=len(reports.deferred))
        if recorded:
            end = batch.read[recorded - 1].position
            assert end is not None  # noqa: S101 - a stream row has a position
            outcome.parked = store.advance(self.using, start=start, end=end,
                                           published=outcome.published, detours=detours,
                                           max_attempts=self.max_attempts,
                                           leader_pid=self._leadership.leader_pid)
            outcome.off_allowlist = {uuid.UUID(m.id): m.topic for m, _why in reports.off_allowlist
                                     if uuid.UUID(m.id) in outcome.parked}
            if detoured_keys is not None and detours:
                detoured_keys.update(m.key for m, _error in reports.detoured)
                detoured_keys.update(m.key for m, _error in reports.deferred)
                detoured_keys.update(m.key for m, _why in reports.off_allowlist)
        self._producer.record_patient(batch, reports, stream=True)
        if outcome.published or outcome.released:
            self._probe = (frozenset() if outcome.published
                           else frozenset(m.key for m in batch.read[recorded:]))
        metrics.observe_delivery_latencies(reports.latencies)
        self._producer.batch_recorded(published=outcome.published, released=outcome.released,
                                      first_unavailable=reports.first_unavailable)
        return self._tally.account(outcome, lane="stream", max_attempts=self.max_attempts)
