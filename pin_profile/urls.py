"""URL configuration: the Django admin is the operator's window onto the ledger; /metrics
is the web process's Prometheus endpoint (django-prometheus)."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("django_prometheus.urls")),
]
