"""manage.py mock_kafka: a local mock Kafka cluster for the demo (librdkafka's, in memory)."""

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from core.commands import ProjectCommand, stop_on_signals
from devtools.mock_kafka import MockKafkaCluster


class Command(ProjectCommand):
    help = (
        "Run librdkafka's in-memory mock Kafka cluster until SIGTERM/SIGINT, printing its "
        "bootstrap address (to stdout, and to --bootstrap-file when given). For the demo and "
        "local trials only: messages live in this process's memory."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--brokers", type=int, default=3, help="number of brokers (3)")
        parser.add_argument("--bootstrap-file", type=Path,
                            help="write the bootstrap address here once the cluster is up")

    def handle(self, *args: Any, **options: Any) -> None:
        with stop_on_signals() as stop, MockKafkaCluster(options["brokers"]) as cluster:
            if options["bootstrap_file"]:
                path: Path = options["bootstrap_file"]
                partial = path.with_suffix(path.suffix + ".tmp")
                partial.write_text(cluster.bootstrap_servers + "\n")
                partial.replace(path)  # readers never see a half-written file
            self.stdout.write(cluster.bootstrap_servers)
            self.stdout.flush()
            stop.wait()
