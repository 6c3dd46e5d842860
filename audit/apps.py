"""The audit: the invariants the tests hold, checked read-only on live data and on the topic."""

from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit"
    default_auto_field = "django.db.models.BigAutoField"
