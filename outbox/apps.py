"""The transactional outbox: rows written with the business change, published to Kafka by a relay."""

from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = "Outbox"
    default_auto_field = "django.db.models.BigAutoField"
