"""The relay's settings for a benchmark line (bench/relay_bench.py, bench/relay_latency.py):
its read sizes, `default`, `N` or `N-fixed` (`BatchSpec`), and the environment of a relay
process of its own (`relay_environ`)."""

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BatchSpec:
    """The relay's read sizes for a line: its defaults (both None), a ceiling (reads grow up to
    it), or a fixed size (floor = ceiling)."""

    ceiling: int | None = None
    floor: int | None = None

    @classmethod
    def parse(cls, text: str) -> "BatchSpec":
        if text == "default":
            return cls()
        if text.endswith("-fixed"):
            size = int(text.removesuffix("-fixed"))
            return cls(size, size)
        return cls(int(text))

    @property
    def label(self) -> str:
        if self.ceiling is None:
            return "default"
        return f"{self.ceiling} fixed" if self.floor == self.ceiling else f"<={self.ceiling}"

    def environ(self) -> dict[str, str]:
        """The relay's variables for it (none for the defaults)."""
        sizes = {"OUTBOX_BATCH_SIZE": self.ceiling, "OUTBOX_BATCH_SIZE_MIN": self.floor}
        return {name: str(value) for name, value in sizes.items() if value is not None}

    def settings(self, **fields: Any) -> Any:
        """RelaySettings with these read sizes (the defaults' where unset)."""
        from outbox.config import RelaySettings

        return RelaySettings(**fields).with_overrides(batch_size=self.ceiling,
                                                      batch_size_min=self.floor)




def relay_environ(database_url: str, bootstrap: str, batch: BatchSpec, topic: str, *,
                  drop: tuple[str, ...] = ("OUTBOX_", "KAFKA_")) -> dict[str, str]:
    """This process's environment for a relay process of its own: none of its variables
    that start with `drop`, the database and the brokers given, `batch`'s read sizes, and
    `topic` the one the relay may publish to (OUTBOX_TOPICS)."""
    environ = {name: value for name, value in os.environ.items() if not name.startswith(drop)}
    environ.update(DATABASE_URL=database_url, KAFKA_BOOTSTRAP_SERVERS=bootstrap,
                   DJANGO_SETTINGS_MODULE="pin_profile.settings", OUTBOX_TOPICS=topic,
                   **batch.environ())
    return environ


