"""`GET /ui`: the live dashboard — one HTML page, a script and a style sheet shipped in the
package (`proxy/ui/`), no CDN, no build step. The page holds no data and no key: it asks for the
admin key once, keeps it in the tab's sessionStorage and polls `GET /admin/status` with it in the
`x-brim-admin-key` header. A `#key=…` fragment (never sent to a server) is read once and removed
from the address bar. The page is off, like the admin endpoints, when no admin key is set; it is
served without the brim API key (a browser cannot send one for a page load), and with a strict
Content-Security-Policy: only its own script, style and data."""

from __future__ import annotations

from importlib import resources

from aiohttp import web

from brim.proxy.keys import FrontDoor
from brim.proxy.routes.admin import require_admin_keys

# name under /ui → (file in proxy/ui, content type)
FILES = {
    "": ("index.html", "text/html"),
    "app.js": ("app.js", "text/javascript"),
    "app.css": ("app.css", "text/css"),
}
UI_PATHS = frozenset({"/ui", *(f"/ui/{name}" for name in FILES)})
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _load() -> dict[str, tuple[bytes, str]]:
    folder = resources.files("brim.proxy").joinpath("ui")
    return {
        name: (folder.joinpath(file).read_bytes(), content_type)
        for name, (file, content_type) in FILES.items()
    }


def add_routes(app: web.Application, door: FrontDoor) -> None:
    files = _load()  # a few kilobytes, read once

    async def serve(request: web.Request) -> web.Response:
        require_admin_keys(request)
        body, content_type = files[request.match_info.get("name", "")]
        return web.Response(
            body=body, content_type=content_type, charset="utf-8", headers=SECURITY_HEADERS
        )

    app.router.add_get("/ui", door(serve))
    app.router.add_get("/ui/{name:(app\\.js|app\\.css)?}", door(serve))
