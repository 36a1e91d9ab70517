"""/docs and /redoc that work offline: Swagger UI and ReDoc served from the fastapi-offline
package's copies of their assets instead of a CDN."""

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from service import urls

ASSETS = Path(fastapi_offline.__file__).parent / "static"
PREFIX = f"{urls.UI}/docs-assets"  # under the dashboard: compressed (DashboardGZip)


def mount_docs(app: FastAPI) -> None:
    """Serve the assets and the two documentation pages (create the app with docs_url=None
    and redoc_url=None)."""
    app.mount(PREFIX, StaticFiles(directory=ASSETS), name="docs-assets")
    title = f"{app.title} API"

    def swagger() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url, title=title,
            swagger_js_url=f"{PREFIX}/swagger-ui-bundle.js",
            swagger_css_url=f"{PREFIX}/swagger-ui.css",
            swagger_favicon_url=f"{PREFIX}/favicon.png")

    def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=app.openapi_url, title=title,
                              redoc_js_url=f"{PREFIX}/redoc.standalone.js",
                              redoc_favicon_url=f"{PREFIX}/favicon.png", with_google_fonts=False)

    app.add_api_route("/docs", swagger, include_in_schema=False)
    app.add_api_route("/redoc", redoc, include_in_schema=False)
