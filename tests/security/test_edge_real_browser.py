"""A real browser's web page cannot drive a loopback brim (issue 34, attack 7), in headless
Chromium rather than with browser-like headers: a page served from another origin posts to every
wire API's path — as a simple `text/plain` POST (no preflight: the request reaches brim) and as a
JSON POST (preflighted) — and nothing reaches the provider. The same page, once the operator
lists its origin in `[server] allowed_origins`, gets its JSON requests through: so the page's
requests do reach brim, and the refusal is brim's."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import pytest

from tests.conftest import BrimFactory, every_api
from tests.fakes import FakeProvider
from tests.proxy.test_bad_input import PATHS
from tests.security.test_edge_input import BODIES

PAGE = """<!doctype html><html><body><pre id="out">running</pre><script>
const brim = %(brim)s, posts = %(posts)s;
async function post(path, body, type) {
  try {
    const reply = await fetch(brim + path, {method: "POST", body, headers: {"Content-Type": type}});
    return reply.status;
  } catch (error) {
    return "blocked";  // a refused preflight, or a reply without CORS headers
  }
}
(async () => {
  const seen = [];
  for (const [path, body] of posts) {
    seen.push(path + " text/plain " + await post(path, body, "text/plain;charset=UTF-8"));
    seen.push(path + " json " + await post(path, body, "application/json"));
  }
  document.getElementById("out").textContent = seen.join("\\n") + "\\ndone";
})();
</script></body></html>"""


@pytest.fixture
def evil_page(brim_url: list[str]) -> Iterator[str]:
    """A page on its own origin (another port of 127.0.0.1) that posts to the brim in
    `brim_url[0]`."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            posts = [[path, orjson.dumps(BODIES[wire]).decode()] for wire, path in PATHS.items()]
            body = PAGE % {
                "brim": orjson.dumps(brim_url[0]).decode(),
                "posts": orjson.dumps(posts).decode(),
            }
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def brim_url() -> list[str]:
    return [""]


def browse(chromium: str, url: str, profile: Path) -> str:
    done = subprocess.run(
        [
            chromium,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def outcomes(dom: str) -> dict[str, str]:
    text = dom[dom.index('<pre id="out">') + len('<pre id="out">') : dom.index("</pre>")]
    lines = text.strip().splitlines()
    assert lines[-1] == "done", text  # the page ran every post
    return {line.rsplit(" ", 1)[0]: line.rsplit(" ", 1)[1] for line in lines[:-1]}


def test_a_foreign_page_in_a_real_browser_reaches_no_provider(
    brim: BrimFactory,
    provider: FakeProvider,
    brim_url: list[str],
    evil_page: str,
    chromium: str,
    tmp_path: Path,
) -> None:
    brim_url[0] = brim(**every_api(provider))
    seen = outcomes(browse(chromium, evil_page, tmp_path / "profile"))
    assert len(seen) == 2 * len(PATHS)
    # The simple POSTs reach brim (no preflight) and are refused; the page cannot read why.
    # The JSON POSTs stop at the preflight. Either way: nothing was forwarded.
    assert set(seen.values()) == {"blocked"}, seen
    assert provider.requests == []


def test_the_same_page_gets_through_once_its_origin_is_allowed(
    brim: BrimFactory,
    provider: FakeProvider,
    brim_url: list[str],
    evil_page: str,
    chromium: str,
    tmp_path: Path,
) -> None:
    """The control: listed in `allowed_origins`, the page's JSON posts are answered (CORS) and
    reach the provider, its text/plain posts are still refused (415), readable now."""
    brim_url[0] = brim(**every_api(provider), server={"allowed_origins": [evil_page]})
    seen = outcomes(browse(chromium, evil_page, tmp_path / "profile"))
    json_posts = {path: status for path, status in seen.items() if path.endswith(" json")}
    plain_posts = {path: status for path, status in seen.items() if path.endswith(" text/plain")}
    assert set(json_posts.values()) == {"200"}, seen
    assert set(plain_posts.values()) == {"415"}, seen
    assert len(provider.requests) == len(PATHS)
