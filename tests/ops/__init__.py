"""Operations: alert rules, Prometheus scrapes, the metrics and health endpoints, the admin in a browser."""
