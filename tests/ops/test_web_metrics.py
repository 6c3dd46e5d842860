"""The web (admin) process exposes its own metrics through django-prometheus."""

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families


@pytest.mark.django_db
def test_web_process_serves_request_metrics(client: Client) -> None:
    assert client.get("/admin/login/").status_code == 200

    response = client.get("/metrics")

    assert response.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(response.content.decode())}
    by_view = {
        s.labels.get("view"): s.value
        for s in families["django_http_requests_total_by_view_transport_method"].samples
        if s.name.endswith("_total")
    }
    assert by_view.get("admin:login", 0) >= 1
