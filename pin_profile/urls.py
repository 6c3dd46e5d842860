"""URL configuration: the Django admin is the operator's window onto the ledger.

The web process's Prometheus metrics are not here: gunicorn's worker serves them on
METRICS_ADDR (pin_profile/gunicorn_conf.py), never on the admin's public port.
"""

from django.contrib import admin
from django.urls import path

urlpatterns = [
    path("admin/", admin.site.urls),
]
