"""The real-cluster tier: Apache Kafka itself (tests/support/kafka_support.py)."""
