"""URL configuration: the Django admin is the operator's window onto the ledger."""

from django.contrib import admin
from django.urls import path

urlpatterns = [
    path("admin/", admin.site.urls),
]
