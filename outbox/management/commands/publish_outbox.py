"""manage.py publish_outbox: relay outbox rows to Kafka, one pass or --loop."""

import os
import threading
from argparse import ArgumentParser
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.core.management.base import CommandError

from core.commands import ProjectCommand, stop_on_signals
from core.config import ConfigError, parse_duration_or_zero
from core.exit_codes import ExitCode
from core.gc_tuning import relax_garbage_collection
from core.health import Heartbeat, Verdict, database_ready
from core.ops_server import Probes, operations_server
from core.progress import ProgressBar
from outbox import kafka, metrics, store
from outbox.config import RelaySettings, load_relay_settings
from outbox.lanes import RelayStats
from outbox.one_pass import publish_one_pass
from outbox.relay import Relay
from outbox.topic_watch import UndurableTopicError

# /healthz fails when the loop has not turned for this long (or 3 poll intervals, if longer).
HEARTBEAT_MIN = timedelta(minutes=5)


class Command(ProjectCommand):
    help = (
        "Publish outbox rows to Kafka (KAFKA_BOOTSTRAP_SERVERS; TLS and SASL from "
        "KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_*, KAFKA_SSL_*; more librdkafka properties from "
        "KAFKA_PRODUCER_CONFIG), at least once and in order per key, then delete published "
        "rows older than OUTBOX_RETENTION. One relay publishes at a time; any other stands by "
        "(a pass that finds one publishing leaves the work to it). One pass by default: "
        "publish what is deliverable now "
        "and exit; --loop runs until SIGTERM/SIGINT, woken by new rows (LISTEN/NOTIFY) or every "
        "OUTBOX_POLL_INTERVAL. The refusals (exit 4) and a pooler by transaction (exit 2) "
        "stop --loop too."
    )
    exit_notes = {
        ExitCode.OK: "also stopped by a signal",
        ExitCode.FAILED: "not everything went out: messages released, failed or deferred "
        "(and parked with them), rows held back past --held-bound by a transaction open on the database "
        "server, the database server in recovery (a standby: --loop stands by until it is "
        "promoted), the reader on another server than the relay leads on, another database "
        "error",
        ExitCode.USAGE: "also a connection pooler that pools by transaction between the relay "
        "and PostgreSQL",
        ExitCode.UNAVAILABLE: "also Kafka did not answer",
        ExitCode.REFUSED: "the broker refused the credentials or TLS handshake, or the "
        "principal may not produce; a topic that may lose what it acknowledges; the stream "
        "ahead of its cluster; a subscription still applying the outbox; the pass stood by past "
        "--stood-by-bound behind a session holding the relays' lock; a table or grant missing; "
        "only a message parked (its topic not on OUTBOX_TOPICS: a person re-queues it)",
    }
    database_failure_prefix = "relay pass failed: "

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--loop", action="store_true",
                            help="publish continuously until SIGTERM/SIGINT")
        parser.add_argument("--batch-size", metavar="N",
                            help="the most rows a batch reads (overrides OUTBOX_BATCH_SIZE; "
                            "reads start at OUTBOX_BATCH_SIZE_MIN, default 100, and grow while "
                            "a backlog drains)")
        parser.add_argument("--held-bound", metavar="DURATION", default="60s",
                            help="one pass: how long to wait for rows held back by a "
                            "transaction open on the database server before exiting 1 "
                            "(default 60s; 0 does not wait)")
        parser.add_argument("--stood-by-bound", metavar="DURATION", default="5m",
                            help="one pass: exit 1, naming the session that holds the relays' "
                            "lock, when the pass stood by and the oldest waiting message is "
                            "this old (default 5m)")

    def handle(self, *args: Any, **options: Any) -> None:
        # --batch-size before the checks: as OUTBOX_BATCH_SIZE, and the producer's queue follows it.
        settings = load_relay_settings(os.environ, batch_size=options["batch_size"])
        kafka.check_producer_config(settings)  # librdkafka's own check, offline: exit 2 too
        held_bound = parse_duration_or_zero("--held-bound", options["held_bound"])
        stood_by_bound = parse_duration_or_zero("--stood-by-bound", options["stood_by_bound"])
        relax_garbage_collection()  # a few short-lived objects a row (core.gc_tuning)
        with stop_on_signals() as stop, refusals_as_exit_codes():
            if options["loop"]:
                self._loop(settings, stop)
                return
            # A bar on a terminal (log lines above it); nothing but the log elsewhere.
            outcome = publish_one_pass(settings, stop=stop, held_bound=held_bound,
                                       stood_by_bound=stood_by_bound,
                                       progress=ProgressBar("outbox messages", "msg"))
        self._summarise(outcome.stats, outcome.backlog)
        if outcome.failure is not None:
            raise CommandError(outcome.failure.line, returncode=outcome.failure.code)

    def _loop(self, settings: RelaySettings, stop: threading.Event) -> None:
        """--loop, with METRICS_ADDR's /metrics, /healthz (the loop beats) and /readyz."""
        beat = Heartbeat(timeout=max(HEARTBEAT_MIN, 3 * settings.poll_interval))
        relay = Relay(settings, stop=stop, heartbeat=beat)

        def ready() -> Verdict:
            database = database_ready()
            return database if not database.ok else relay.readiness()

        with operations_server(os.environ, Probes(beat.liveness, ready),
                               prepare=metrics.install_relay_metrics):
            relay.run_loop()

    def _summarise(self, stats: RelayStats, backlog: store.Backlog) -> None:
        self.stdout.write("\n".join([
            f"Relay pass: {stats.published} published in {stats.batches} batch(es)",
            f"  released (broker unavailable)  {stats.released}",
            f"  failed (retried later)         {stats.failed}",
            *([f"  deferred (partition unavailable) {stats.deferred}"] if stats.deferred else []),
            f"  parked                         {stats.parked}",
            f"  pruned                         {stats.pruned}",
            *(["  stood by: another relay was publishing"] if stats.stood_by else []),
            *(["  broker: no answer to the metadata request"] if not stats.broker_answered
              else []),
            *([f"  held back by an open transaction  {stats.held_for_s:.0f}s"]
              if stats.held_for_s else []),
            f"  still unpublished              {backlog.unpublished}",
            f"  parked in total                {backlog.parked}",
        ]))


@contextmanager
def refusals_as_exit_codes() -> Iterator[None]:
    """What makes the relay refuse to go on, as one line and an exit code (a pass and --loop):
    what a person must set right (core.exit_codes: REFUSED), what passes by itself (FAILED), a
    pooler by transaction (DATABASE_URL: USAGE). A database failure is the base command's."""
    try:
        yield
    except UndurableTopicError as exc:  # the topic's to fix (its owner's), not the relay's settings
        raise CommandError(f"bad configuration: {exc}", returncode=ExitCode.REFUSED) from None
    except (kafka.KafkaRefusedError, store.StreamAheadError,
            store.StreamSubscribedError) as exc:
        raise CommandError(str(exc), returncode=ExitCode.REFUSED) from None
    except (store.ServerInRecoveryError, store.ReaderOnAnotherServerError) as exc:
        raise CommandError(str(exc), returncode=ExitCode.FAILED) from None
    except store.SessionChangedError as exc:
        raise ConfigError("DATABASE_URL", str(exc)) from None
