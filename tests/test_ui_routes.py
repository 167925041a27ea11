"""The dashboard's HTTP side, in process: its files are served with their types and a strict
Content-Security-Policy, public even with JWT on (they hold no data), and gone when switched off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from taskgrove.agent.surfaces.ui import STATIC

SECRET = "ui-routes-secret-with-enough-bytes-for-hs256"


async def test_page_and_every_module_are_served(client: Any) -> None:
    page = await client.http.get("/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert (await client.http.get("/ui/", follow_redirects=False)).headers["location"] == "/ui"
    names = sorted(p.name for p in Path(STATIC).iterdir())
    assert "app.js" in names and "style.css" in names
    for name in names:
        asset = await client.http.get(f"/ui/static/{name}")
        assert asset.status_code == 200, name
        if name.endswith(".js"):  # browsers refuse an ES module served under another type
            assert asset.headers["content-type"].startswith("text/javascript"), name
    assert (await client.http.get("/ui/static/../settings.py")).status_code == 404


async def test_static_files_are_public_with_jwt_on_while_data_needs_the_token(app_factory: Any) -> None:
    async with app_factory(env={"SERVICE_JWT_SECRET": SECRET}) as client:
        assert (await client.http.get("/ui")).status_code == 200
        assert (await client.http.get("/ui/static/api.js")).status_code == 200
        refused = await client.http.post("/tasks", json={"jsonrpc": "2.0", "id": 1, "method": "tasks.list"})
        assert refused.status_code == 401


async def test_the_dashboard_can_be_turned_off(app_factory: Any) -> None:
    async with app_factory(env={"SERVICE_ENABLE_UI": "false"}) as client:
        assert (await client.http.get("/ui")).status_code == 404
        assert (await client.http.get("/ui/static/app.js")).status_code == 404
