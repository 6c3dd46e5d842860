"""When a row that did not go out is tried again, for both lanes: a row the broker refused after
its attempt's backoff, a row its partition could not take after that partition's backoff (it
grows with the batches the partition failed in a row; outbox.kafka.PartitionOutages); each said
in a line, the partitions' outages in their own log and metrics."""

import logging
import random
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta

from confluent_kafka import KafkaError

from core.supervise import backoff_delay
from outbox import metrics
from outbox.config import Emit
from outbox.kafka import Partition, PartitionOutages, describe
from outbox.store import ReadMessage


class Retries:
    """The retry delays of one relay (OUTBOX_BACKOFF_INITIAL up to OUTBOX_BACKOFF_MAX, jittered)
    and its partitions' outages (said once per OUTBOX_OUTAGE_LOG_INTERVAL)."""

    def __init__(self, *, backoff_initial: timedelta, backoff_max: timedelta,
                 outage_log_interval: timedelta, emit: Emit, rng: random.Random) -> None:
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._emit = emit
        self._rng = rng
        self.partitions = PartitionOutages(emit, interval_s=outage_log_interval.total_seconds())

    def _delay(self, failures: int) -> float:
        return backoff_delay(failures, self._backoff_initial, self._backoff_max, self._rng)

    def describe_refusal(self, message: ReadMessage, error: KafkaError) -> tuple[str, timedelta]:
        """A row the broker refused: its error and retry delay to record, said in a line."""
        delay = self._delay(message.attempts + 1)
        self._emit(logging.WARNING, "message not delivered", {
            "message_id": message.id, "attempt": message.attempts + 1,
            "error": describe(error), "retry_in_s": round(delay, 3)})
        return describe(error), timedelta(seconds=delay)

    def describe_deferrals(self, deferred: Sequence[tuple[ReadMessage, KafkaError]],
                           partitions: Mapping[str, int]) -> dict[str, tuple[str, timedelta]]:
        """Rows their partition could not take now (`partitions`: by key, as reported): for each
        (by id) its error and retry delay, the partition's backoff, which grows with the batches
        it failed in a row; said in that partition's outage log and metrics."""
        by_partition: dict[Partition, list[tuple[ReadMessage, KafkaError]]] = {}
        for message, error in deferred:
            where = (message.topic, partitions.get(message.key, -1))
            by_partition.setdefault(where, []).append((message, error))
        described: dict[str, tuple[str, timedelta]] = {}
        for where, rows in by_partition.items():
            failures = self.partitions.failed(where, (m.key for m, _e in rows),
                                              describe(rows[0][1]))
            metrics.record_deferred(*where, len(rows))
            for message, error in rows:
                described[message.id] = (describe(error), timedelta(seconds=self._delay(failures)))
        return described

    def delivered(self, keys: Iterable[str]) -> None:
        """Rows of `keys` delivered: a partition they had been deferred for is back."""
        for topic, partition in self.partitions.delivered(keys):
            metrics.set_partition_available(topic, partition)
