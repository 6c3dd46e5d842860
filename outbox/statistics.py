"""librdkafka's statistics (`statistics.interval.ms`, a JSON document per interval), reduced to
what an operator watches: whether a broker is up, each broker's round-trip time, and the
producer's outbound queue. Reference: librdkafka's STATISTICS.md."""

import json
from dataclasses import dataclass, field
from typing import Any

# librdkafka reports times in microseconds.
US_PER_S = 1_000_000


@dataclass(frozen=True, slots=True)
class ProducerStatistics:
    """One statistics document, as the metrics read it."""

    queue_messages: int = 0  # msg_cnt: produced, not yet acknowledged or failed
    queue_bytes: int = 0  # msg_size
    any_broker_up: bool = False
    # host:port of each broker that is up -> its round-trip time in seconds (p99 of the
    # interval), None when it answered no request in the interval; bootstrap entries (node id
    # -1) are not brokers yet.
    rtt_s: dict[str, float | None] = field(default_factory=dict)


def parse_statistics(text: str) -> ProducerStatistics:
    """The fields the relay exports; a field librdkafka left out counts as absent or zero."""
    document: dict[str, Any] = json.loads(text)
    brokers: dict[str, dict[str, Any]] = document.get("brokers") or {}
    rtt_s: dict[str, float | None] = {}
    for name, broker in brokers.items():
        if int(broker.get("nodeid", -1)) < 0 or broker.get("state") != "UP":
            continue
        rtt = broker.get("rtt") or {}
        answered = int(rtt.get("cnt", 0)) > 0
        rtt_s[str(broker.get("nodename") or name)] = (float(rtt.get("p99", 0)) / US_PER_S
                                                       if answered else None)
    return ProducerStatistics(
        queue_messages=int(document.get("msg_cnt", 0)),
        queue_bytes=int(document.get("msg_size", 0)),
        any_broker_up=any(b.get("state") == "UP" for b in brokers.values()),
        rtt_s=rtt_s,
    )
