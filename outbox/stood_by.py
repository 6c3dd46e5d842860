"""Whether a one-shot pass that stood by must fail (docs/outbox-relay.md, "One batch", 0): another
session holds the relays' lock, and rows have waited past a bound all the same, so that session
publishes nothing (a relay behind a pooler by transaction leaves its lock on a pooled server
connection that publishes nothing until the pooler closes it). Pure: the pass's facts in, the
verdict out; publish_outbox names the lock's holder."""


def stood_by_while_rows_waited(*, stood_by: bool, oldest_waiting_s: float | None,
                               bound_s: float) -> bool:
    """True when the pass stood by and the oldest waiting row is at least `bound_s` old."""
    return stood_by and oldest_waiting_s is not None and oldest_waiting_s >= bound_s
