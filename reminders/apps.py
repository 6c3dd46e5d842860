"""The reminders app: the expiry-reminder worker, its ledger, its run history and its admin."""

from django.apps import AppConfig


class RemindersConfig(AppConfig):
    name = "reminders"
    verbose_name = "Document-expiry reminders"
    default_auto_field = "django.db.models.BigAutoField"
