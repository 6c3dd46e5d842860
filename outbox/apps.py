"""The transactional outbox: rows written with the business change, published to Kafka by a relay."""

from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = "Outbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core import admin, gauges
        from outbox.admin import backlog_card, run_events_url
        from outbox.metrics import outbox_gauges

        # Whoever serves metrics or the admin overview shows the outbox backlog, unaware of this app.
        gauges.offer("outbox", outbox_gauges)
        admin.offer_card("outbox", backlog_card)
        admin.offer_run_events_link(run_events_url)
