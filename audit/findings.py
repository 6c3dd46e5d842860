"""The audit's finding codes, each spelled once: the check that reports it, what it means,
what to do, and its section of the runbook (docs/operations.md, "Auditing the reminders")."""

from dataclasses import dataclass

RUNBOOK = "docs/operations.md"


@dataclass(frozen=True, slots=True)
class Code:
    """One kind of disagreement a check may find; an informational one is counted and listed
    but is no finding: it neither fails the audit nor feeds its alert."""

    code: str
    check: str
    what: str
    action: str
    informational: bool = False

    @property
    def runbook(self) -> str:
        return f"{RUNBOOK}#audit-{self.code.replace('_', '-')}"


MARKER_WITHOUT_EVENT = Code(
    "marker_without_event", "ledger_outbox",
    "a notified marker that no event of its run lists at its threshold and expiry: the ledger "
    "says told, the outbox never had it",
    "delete the listed markers after checking the investors were not told "
    "(run_expiry_reminders re-reminds them)")
EVENT_WITHOUT_MARKER = Code(
    "event_without_marker", "ledger_outbox",
    "an event lists a document whose marker of that run is missing (not pruned, not re-armed "
    "since): the next cycle may tell the investor again",
    "find what deleted the markers (a restore, a manual delete); the events were sent, and a "
    "repeat under another message id is told again")
NOTIFIED_TWICE = Code(
    "notified_twice", "ledger_outbox",
    "the same (document, threshold, expiry) in more events than its marker has had armings: "
    "one arming told twice, under two message ids",
    "consumers deduplicating by message_id told the investor twice; find the run that "
    "repeated it (two databases, a ledger that lost part of an owner's markers)")
ALREADY_QUEUED = Code(
    "already_queued", "ledger_outbox",
    "a run replayed an arming whose markers were lost (a restore, a rollback) and found its "
    "reminder in the outbox under its message id, queued by another run, saying the same: it "
    "wrote no second event (its run's owners_already_queued); informational, not a finding",
    "nothing, after a restore or rollback of the ledger; otherwise find what removed the "
    "markers", informational=True)
LEFT_BEHIND = Code(
    "left_behind", "left_behind",
    "a document due at the cycle's as-of, unchanged since, without its marker: its investor "
    "was not reminded",
    "run manage.py run_expiry_reminders (the manual re-trigger) and audit again; if it stays, "
    "the cycle misses it: report it with the ids")
POSITION_OF_ANOTHER_CLUSTER = Code(
    "position_of_another_cluster", "relay_position",
    "the stream's ids were stamped on another cluster (a dump restored here, a "
    "logical-replication cut-over, pg_upgrade) and nothing was written or relayed here since: "
    "the first insert or relay pass records the move, re-basing the stream if this cluster's "
    "ids are behind",
    "let one relay pass run (docs/outbox-relay.md, 'The stream on a new cluster'), then audit "
    "again with --against-topic")
POSITION_AHEAD = Code(
    "position_ahead", "relay_position",
    "stored stream ids are at or past this cluster's next transaction id: rows written now "
    "would sort behind the position and never be sent",
    "follow docs/runbooks/outbox-backlog.md, 'The stream is ahead of its cluster'")
WAITED_TOO_LONG = Code(
    "waited_too_long", "relay_waits",
    "an event waited longer than the bound for the relay (until published, or until now if "
    "still waiting)",
    "check the relay is running and leading (check_reminders_health, its metrics); the outbox "
    "lag alert says since when")
PARKED = Code(
    "parked", "parked",
    "the relay gave up on an event after its attempts: it and its key's later events wait",
    "fix the cause in last_error, then manage.py requeue_outbox")
PARKED_OFF_ALLOWLIST = Code(
    "parked_off_allowlist", "parked",
    "a parked event whose topic is not on OUTBOX_TOPICS: the relay never sent it; the worker "
    "writes only the contract's topic, so someone wrote it with the worker's credentials, or "
    "the relay lacks a topic it should serve",
    "find the writer; add a legitimate topic to OUTBOX_TOPICS and manage.py requeue_outbox, "
    "otherwise delete the row as the table owner")
MISSING_FROM_TOPIC = Code(
    "missing_from_topic", "topic",
    "the table says published, the topic has no record with that message_id",
    "the investors were not told: after a database move or restore stop the relay (its "
    "position may be another cluster's); the rows are intact, re-send them once the cause is "
    "fixed, and report it")
UNKNOWN_ON_TOPIC = Code(
    "unknown_on_topic", "topic",
    "a record in the window whose message_id the outbox does not hold",
    "find the producer (another database, a restore, a tool); consumers cannot tell it from a "
    "reminder")
DUPLICATED_ON_TOPIC = Code(
    "duplicated_on_topic", "topic",
    "a message_id on the topic more than once",
    "at-least-once allows it after a relay crash; consumers deduplicate. Many of them: look "
    "for a position moved back")
OUT_OF_ORDER = Code(
    "out_of_order", "topic",
    "a key whose first copies on the topic are not in the outbox's order",
    "a consumer may have applied an older reminder last; report the keys")

# Every code, by check, in the order the checks run and print.
CODES: tuple[Code, ...] = (
    MARKER_WITHOUT_EVENT, EVENT_WITHOUT_MARKER, NOTIFIED_TWICE, ALREADY_QUEUED, LEFT_BEHIND,
    POSITION_OF_ANOTHER_CLUSTER, POSITION_AHEAD, WAITED_TOO_LONG, PARKED, PARKED_OFF_ALLOWLIST,
    MISSING_FROM_TOPIC, UNKNOWN_ON_TOPIC, DUPLICATED_ON_TOPIC, OUT_OF_ORDER,
)


def codes_of(check: str, *, informational: bool | None = None) -> tuple[Code, ...]:
    """A check's codes; only the informational ones, or only the findings, when asked."""
    return tuple(c for c in CODES if c.check == check
                 and (informational is None or c.informational == informational))
