"""audit.loop: `audit_reminders --loop` on core.supervise: failures counted and backed off
(doubling, capped), an audit recorded as metrics and then a wait of one interval; on a fake
audit, a fake wait and a registry of its own."""

import logging
import random
import threading
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from audit import findings
from audit.loop import AuditMetrics, run_audit_loop
from audit.report import AuditReport, CheckResult, Finding, Status
from core.supervise import Backoff

EVERY = timedelta(hours=1)
NOW = datetime(2030, 1, 1, tzinfo=UTC)


def report(parked: int) -> AuditReport:
    return AuditReport(as_of=NOW, since=NOW - timedelta(days=7), database_now=NOW, checks=[
        CheckResult.of("parked", "no parked event", {"parked": parked},
                       [Finding(findings.PARKED, parked)]),
        CheckResult("topic", "outbox against the topic", Status.NOT_CHECKED, note="not asked"),
    ])


def test_failures_back_off_and_count_then_an_audit_is_recorded_and_waits_an_interval() -> None:
    stop = threading.Event()
    waits: list[float] = []
    outcomes: list[Exception | AuditReport] = [ConnectionError("down"), ConnectionError("down"),
                                               report(parked=2)]

    def audit() -> AuditReport:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def wait(seconds: float) -> None:
        waits.append(seconds)
        if not outcomes:
            stop.set()

    registry = CollectorRegistry()
    metrics = AuditMetrics(registry)
    backoff = Backoff(timedelta(seconds=10), timedelta(seconds=15), wait=wait,
                      rng=random.Random(3))

    run_audit_loop(audit, every=EVERY, backoff=backoff, stop=stop, metrics=metrics,
                   failures=(ConnectionError,), wait=wait)

    first, second, interval = waits
    assert 5 <= first <= 10 and 7.5 <= second <= 15  # doubled, then capped
    assert interval == EVERY.total_seconds()
    assert backoff.failures("audit") == 0  # the audit that completed cleared them
    assert registry.get_sample_value("profile_document_expiry_reminder_audit_failures_total") == 2
    assert registry.get_sample_value("profile_document_expiry_reminder_audit_findings",
                                     {"check": "parked", "finding": "parked"}) == 2
    assert registry.get_sample_value(  # a check not run has no series
        "profile_document_expiry_reminder_audit_findings",
        {"check": "topic", "finding": "missing_from_topic"}) is None


def test_an_unexpected_error_is_not_retried() -> None:
    stop = threading.Event()

    def audit() -> AuditReport:
        raise KeyError("a bug")

    backoff = Backoff(timedelta(seconds=1), timedelta(seconds=1), wait=lambda _: None)
    with pytest.raises(KeyError, match="a bug"):
        run_audit_loop(audit, every=EVERY, backoff=backoff, stop=stop,
                       metrics=AuditMetrics(CollectorRegistry()), failures=(ConnectionError,))


def test_a_noted_code_has_no_finding_series_and_is_logged_apart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    queued = CheckResult.of("ledger_outbox", "ledger and outbox agree", {"runs": 2}, [
        Finding(findings.ALREADY_QUEUED, 3)])
    noted = AuditReport(as_of=NOW, since=NOW - timedelta(days=7), database_now=NOW,
                        checks=[queued])
    stop = threading.Event()
    registry = CollectorRegistry()

    with caplog.at_level(logging.INFO, logger="audit.loop"):
        run_audit_loop(lambda: noted, every=EVERY, stop=stop, metrics=AuditMetrics(registry),
                       backoff=Backoff(timedelta(seconds=1), timedelta(seconds=1),
                                       wait=lambda _: None),
                       failures=(ConnectionError,), wait=lambda _: stop.set())

    series = {"check": "ledger_outbox", "finding": "already_queued"}
    assert registry.get_sample_value(
        "profile_document_expiry_reminder_audit_findings", series) is None
    assert registry.get_sample_value("profile_document_expiry_reminder_audit_findings",
                                     {**series, "finding": "notified_twice"}) == 0
    [completed] = [r for r in caplog.records if r.getMessage() == "audit completed"]
    assert completed.levelno == logging.INFO
    fields = getattr(completed, "fields", {})
    assert (fields["findings"], fields["noted"]) == (0, {"already_queued": 3})
