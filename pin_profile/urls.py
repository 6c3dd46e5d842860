"""URL configuration: the Django admin is the operator's window onto the ledger.

The web process's Prometheus metrics are not here: gunicorn's worker serves them on
METRICS_ADDR (pin_profile/gunicorn_conf.py), never on the admin's public port.
"""

from django.contrib import admin
from django.urls import path

# There is no site beside the admin ("View site" led to a 404), and the lists need the width
# the navigation sidebar took (the breadcrumbs and the index lead everywhere it did).
admin.site.site_url = None
admin.site.enable_nav_sidebar = False

urlpatterns = [
    path("admin/", admin.site.urls),
]
