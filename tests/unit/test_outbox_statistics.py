"""librdkafka's statistics document, reduced to what the relay exports."""

import json
from typing import Any

from outbox.metrics import ProducerStatistics, parse_statistics


def broker(nodeid: int, nodename: str, state: str, *, cnt: int, p99: int) -> dict[str, Any]:
    return {"nodeid": nodeid, "nodename": nodename, "state": state,
            "rtt": {"min": 0, "max": p99, "avg": p99 // 2, "p99": p99, "cnt": cnt}}


def test_queue_up_brokers_and_their_round_trip_in_seconds() -> None:
    document = {
        "name": "relay-1#producer-1", "type": "producer", "msg_cnt": 42, "msg_size": 4_200,
        "brokers": {
            "kafka-1:9092/bootstrap": broker(-1, "kafka-1:9092", "UP", cnt=3, p99=900),
            "kafka-1:9092/1": broker(1, "kafka-1:9092", "UP", cnt=10, p99=12_500),
            "kafka-2:9092/2": broker(2, "kafka-2:9092", "UP", cnt=0, p99=0),
            "kafka-3:9092/3": broker(3, "kafka-3:9092", "DOWN", cnt=2, p99=80_000),
        },
    }
    assert parse_statistics(json.dumps(document)) == ProducerStatistics(
        queue_messages=42, queue_bytes=4_200, any_broker_up=True,
        # the bootstrap entry is no broker; kafka-2 answered nothing; kafka-3 is down
        rtt_s={"kafka-1:9092": 0.0125, "kafka-2:9092": None},
    )


def test_no_broker_up_and_missing_fields() -> None:
    document = {"brokers": {"k:9092/bootstrap": broker(-1, "k:9092", "CONNECT", cnt=0, p99=0)}}
    assert parse_statistics(json.dumps(document)) == ProducerStatistics()
    assert parse_statistics("{}") == ProducerStatistics()
