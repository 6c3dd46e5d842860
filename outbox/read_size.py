"""How many rows the stream's next read asks for (docs/outbox-relay.md, "The read size"): few
while the stream is nearly caught up, so a row waits behind few others; twice as many after
each read that came back full, so a backlog drains in large batches; fewer after a short one;
never more than OUTBOX_BATCH_SIZE (the ceiling) nor than MAX_READ_BYTES of rows hold (the
memory bound). Pure: no I/O, no clock."""

from dataclasses import dataclass

# The smallest read, and the first (a ceiling below it is the only size).
MIN_READ_ROWS = 100
# The payload and headers text one read may hold: with two batches in flight and one read ahead
# (and librdkafka's copies of the two in flight) the relay's peak RSS stays under 150 MB.
MAX_READ_BYTES = 8 * 1024 * 1024


def next_read_rows(asked: int, got: int, got_bytes: int, *, floor: int, ceiling: int,
                   max_bytes: int = MAX_READ_BYTES) -> int:
    """The size of the read after one that asked for `asked` rows and returned `got` of them,
    `got_bytes` of payload and headers: double after a full read, else twice what came (at
    most half the last size, at least `floor`); within the ceiling and the bytes' bound (which
    wins over the floor, down to one row)."""
    full = got >= asked
    rows = min(asked * 2 if full else max(floor, min(asked // 2, got * 2)), ceiling)
    if got and got_bytes:
        rows = min(rows, max(1, max_bytes * got // got_bytes))  # at this read's bytes a row
    return rows


@dataclass(slots=True)
class ReadSize:
    """The read size of one relay's stream: `rows` for the next read, then `observe` what came."""

    ceiling: int
    floor: int
    max_bytes: int = MAX_READ_BYTES
    rows: int = 0

    @classmethod
    def up_to(cls, ceiling: int, *, floor: int = MIN_READ_ROWS,
              max_bytes: int = MAX_READ_BYTES) -> "ReadSize":
        """Start at the floor (the ceiling, if it is smaller)."""
        if ceiling < 1 or floor < 1 or max_bytes < 1:
            raise ValueError(f"read sizes are positive, got ceiling {ceiling}, floor {floor}, "
                             f"max_bytes {max_bytes}")
        floor = min(floor, ceiling)
        return cls(ceiling, floor, max_bytes, floor)

    def observe(self, asked: int, got: int, got_bytes: int) -> int:
        """Take a read's outcome into account; the next read's size."""
        self.rows = next_read_rows(asked, got, got_bytes, floor=self.floor,
                                   ceiling=self.ceiling, max_bytes=self.max_bytes)
        return self.rows
