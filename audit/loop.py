"""`audit_reminders --loop`: the audit once per interval, its last findings per check as
metrics on METRICS_ADDR (docs/operations.md, "Auditing the reminders"; the alert
DocumentExpiryReminderAuditFindings), a failure retried with backoff (core.supervise)."""

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from audit.findings import codes_of
from audit.report import AuditReport, Status
from core.logs import log_event
from core.supervise import Backoff, Wait, supervise

logger = logging.getLogger("audit.loop")


@dataclass
class AuditMetrics:
    """The last audit's findings by check and finding; when it last completed; its failures."""

    registry: CollectorRegistry = field(default_factory=lambda: REGISTRY)

    def __post_init__(self) -> None:
        self.findings = Gauge(
            "profile_document_expiry_reminder_audit_findings",
            "Findings of the last completed audit, by check and finding (0: clean); a check "
            "not run has no series", ["check", "finding"], registry=self.registry)
        self.last_completed = Gauge(
            "profile_document_expiry_reminder_audit_last_completed_timestamp_seconds",
            "When the last audit completed (Unix time)", registry=self.registry)
        self.failures = Counter(
            "profile_document_expiry_reminder_audit_failures",
            "Audits that could not complete (database or broker unavailable)",
            registry=self.registry)

    def record(self, report: AuditReport) -> None:
        """Every finding of every check that ran, 0 when clean; a check not run is dropped."""
        for check in report.checks:
            counts = {f.code: f.count for f in check.findings}
            for kind in codes_of(check.name, informational=False):
                if check.status is Status.NOT_CHECKED:
                    with contextlib.suppress(KeyError):  # never set
                        self.findings.remove(check.name, kind.code)
                else:
                    self.findings.labels(check.name, kind.code).set(counts.get(kind.code, 0))
        self.last_completed.set(time.time())


def run_audit_loop(audit: Callable[[], AuditReport], *, every: timedelta, backoff: Backoff,
                   stop: threading.Event, metrics: AuditMetrics,
                   failures: tuple[type[BaseException], ...], wait: Wait | None = None) -> None:
    """Audit now, then once per `every`, until `stop`. A failure (one of `failures`) is logged
    and counted, and the audit retried after the backoff's wait (core.supervise)."""
    wait = wait or stop.wait

    def step() -> None:
        report = audit()
        backoff.succeeded()
        metrics.record(report)
        log_event(logger, logging.WARNING if report.findings else logging.INFO,
                  "audit completed", findings=report.findings,
                  by_check={c.name: sum(f.count for f in c.findings) for c in report.checks
                            if c.status is not Status.NOT_CHECKED},
                  noted={f.code: f.count for c in report.checks for f in c.noted})
        wait(every.total_seconds())

    def failed(exc: BaseException, attempt: int, delay: float) -> None:
        metrics.failures.inc()
        log_event(logger, logging.ERROR, "audit failed", error=str(exc).splitlines()[0],
                  attempt=attempt, retry_in_s=round(delay, 1))

    supervise(step, stop=stop, backoff=backoff, retry_on=failures, kind="audit", said=failed)
