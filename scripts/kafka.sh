#!/usr/bin/env bash
# Apache Kafka itself for development and tests: three KRaft nodes on loopback (each a broker
# and a controller), the jars pinned by devtools/kafka/pom.xml and fetched by Maven once.
#   scripts/kafka.sh start [--dir DIR]   # prints KAFKA_BOOTSTRAP_SERVERS=... (then the SASL_SSL
#                                        # listener, its CA and the cluster's directory)
#   scripts/kafka.sh status [--dir DIR]
#   scripts/kafka.sh stop [--dir DIR]    # stops every node and removes DIR
# DIR defaults to KAFKA_CLUSTER_DIR, else /tmp/pin-profile-kafka. Installs Debian's Java 17
# runtime, Maven and openssl when missing. devtools/kafka_cluster.py does the work.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/apt.sh
kafka_tools_ensure() {
    local missing=()
    command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
    command -v mvn >/dev/null || missing+=(maven)
    command -v openssl >/dev/null || missing+=(openssl)
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "kafka.sh: installing ${missing[*]}" >&2
        apt_install "${missing[@]}"
    fi
}
kafka_tools_ensure
source scripts/venv.sh >&2
exec "$PY" -m devtools.kafka_cluster "$@"
