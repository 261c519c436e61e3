"""/docs and /redoc load Swagger UI and ReDoc from the server itself (fastapi-offline's files), not a CDN."""

from __future__ import annotations

import re

import httpx
import pytest

ASSET = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_docs_pages_use_only_local_assets(client: httpx.AsyncClient, page: str) -> None:
    html = (await client.get(page)).text
    assets = ASSET.findall(html)
    assert assets, html
    assert not [a for a in assets if "//" in a], f"{page} loads from another host: {assets}"
    assert "fonts.googleapis" not in html and "cdn." not in html
    for asset in assets:
        response = await client.get(asset)
        assert response.status_code == 200 and len(response.content) > 1000, asset
    assert "validatorUrl" not in html or '"validatorUrl": null' in html
