"""The web (admin) process counts its requests through django-prometheus, and its public URLs
have no /metrics: gunicorn's worker serves the registry on METRICS_ADDR instead
(pin_profile/gunicorn_conf.py; scraped for real in tests/ops/test_admin_production.py)."""

import pytest
from django.test import Client
from prometheus_client import REGISTRY


def _login_page_requests() -> float:
    value = REGISTRY.get_sample_value("django_http_requests_total_by_view_transport_method_total",
                                      {"view": "admin:login", "transport": "http", "method": "GET"})
    return value or 0.0


@pytest.mark.django_db
def test_requests_are_counted_but_metrics_are_not_on_the_public_urls(client: Client) -> None:
    before = _login_page_requests()

    assert client.get("/admin/login/").status_code == 200
    assert client.get("/metrics").status_code == 404

    assert _login_page_requests() == before + 1
