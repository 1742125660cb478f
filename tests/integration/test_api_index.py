"""``GET /``, the index, and the docs pages, which load every asset from the app itself
(no CDN: they work without internet)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest

from cronwheel.version import package_version


async def test_the_index_names_the_server_and_links_where_to_go(api: Any) -> None:
    r = await api.client.get("/")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["name"] == "cronwheel" and body["version"] == package_version()
    links = body["links"]
    for name in ("docs", "openapi", "healthz", "jobs", "runs", "tenants"):
        assert name in links, name
    for name in ("docs", "redoc", "openapi", "healthz", "readyz"):
        assert (await api.client.get(links[name])).status_code == 200, name
    for name in ("jobs", "runs", "tenants", "metrics"):
        assert (await api.client.get(links[name])).status_code == 401, name
    dashboard = await api.client.get(links["dashboard"])
    assert dashboard.status_code == 303 and dashboard.headers["location"] == "/ui/overview"
    r = await api.client.post("/", json={})
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def _assets(page: str) -> list[str]:
    return re.findall(r"""(?:src|href)\s*[=:]\s*["']([^"']+)["']""", page)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_docs_pages_load_every_asset_from_the_app(api: Any, page: str) -> None:
    r = await api.client.get(page)
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    html = r.text
    assert "cdn" not in html.lower() and "googleapis" not in html
    assets = _assets(html)
    assert any(a.endswith(".js") for a in assets), assets
    base = str(api.client.base_url)
    for asset in assets:
        url = urljoin(base + page, asset)
        assert urlsplit(url).netloc == urlsplit(base).netloc, asset  # nothing from outside
        got = await api.client.get(url)
        assert got.status_code == 200 and got.content, asset
    # The schema they render.
    assert "/openapi.json" in html
    assert (await api.client.get("/openapi.json")).status_code == 200
