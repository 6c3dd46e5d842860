"""Python's cyclic garbage collector, set for a process that allocates many short-lived objects
a second (the relay: a few per outbox row) and makes next to no cycles."""

import gc

# A young-generation collection every this many (net) new objects, not Python's 700: at the
# default the collector took 10-15% of the relay's time (docs/history/performance-relay-rounds.md); a bound
# all the same, so that cyclic garbage still goes within a few megabytes.
YOUNG_THRESHOLD = 20_000


def relax_garbage_collection() -> None:
    """Freeze what start-up allocated (Django, the settings, the modules: never garbage, so no
    collection walks it again) and collect the young generation less often. No full collection
    first: it took 20 ms of the relay's start-up to find about 50 unreachable objects (measured),
    which stay frozen."""
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
