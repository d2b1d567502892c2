"""The UI's static files, without a browser: every file the page loads exists, is served with
the right type and headers, and the vendored libraries are the versions VENDORED.md names."""

from __future__ import annotations

import re

from llamaserve.webui import CSP, STATIC_DIR, headers_for

WEBUI = STATIC_DIR.parent


def local_refs(html: str) -> list[str]:
    refs = re.findall(r'(?:src|href)="([^"#][^"]*)"', html)
    return [r for r in refs if not re.match(r"^[a-z]+:", r)]


def test_every_file_the_page_loads_exists() -> None:
    html = (STATIC_DIR / "index.html").read_text()
    refs = local_refs(html)
    assert "js/app.js" in refs and "css/app.css" in refs
    for ref in refs:
        assert (STATIC_DIR / ref).is_file(), ref
    for js in (STATIC_DIR / "js").glob("*.js"):
        for target in re.findall(r'^\s*import\b[^"\']*["\'](\.[^"\']+)["\']', js.read_text(), re.M):
            assert (js.parent / target).resolve().is_file(), f"{js.name} imports {target}"


def test_katex_fonts_present() -> None:
    css = (STATIC_DIR / "vendor/katex/katex.min.css").read_text()
    woff2 = set(re.findall(r"url\((fonts/[^)]+\.woff2)\)", css))
    assert len(woff2) > 15
    for font in woff2:
        assert (STATIC_DIR / "vendor/katex" / font).is_file(), font


def test_vendored_versions_match_the_notes() -> None:
    notes = (WEBUI / "VENDORED.md").read_text()
    marked = re.search(r"marked v(\d+\.\d+\.\d+)", (STATIC_DIR / "vendor/marked/marked.esm.js").read_text())
    hljs = re.search(r"Highlight\.js v(\d+\.\d+\.\d+)", (STATIC_DIR / "vendor/highlight/highlight.min.js").read_text())
    katex = re.search(r'version:"(\d+\.\d+\.\d+)"', (STATIC_DIR / "vendor/katex/katex.min.js").read_text())
    for name, found in (("marked", marked), ("highlight.js", hljs), ("katex", katex)):
        assert found, f"no version found in the vendored {name}"
        assert f"| {found.group(1)} |" in notes, f"VENDORED.md does not list {name} {found.group(1)}"
    for lib in ("marked", "highlight", "katex"):
        assert (STATIC_DIR / "vendor" / lib / "LICENSE").is_file()


def test_no_remote_urls_in_our_code() -> None:
    for path in [*STATIC_DIR.glob("*.html"), *(STATIC_DIR / "js").glob("*.js"), *(STATIC_DIR / "css").glob("*.css")]:
        text = path.read_text()
        # Only the SVG namespace may look like a URL.
        remote = [u for u in re.findall(r"https?://[^\s\"'<>)]+", text) if u != "http://www.w3.org/2000/svg"]
        assert remote == [], f"{path.name}: {remote}"


def test_headers() -> None:
    assert headers_for("index.html")["Content-Security-Policy"] == CSP
    assert headers_for("js/app.js") == {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


def test_served_by_starlette() -> None:
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from llamaserve.webui import static_files

    app = Starlette()
    app.mount("/", static_files(), name="webui")
    client = TestClient(app)
    index = client.get("/")
    assert index.status_code == 200
    assert 'data-testid="app"' in index.text
    assert index.headers["content-type"].startswith("text/html")
    assert index.headers["content-security-policy"] == CSP
    assert index.headers["cache-control"] == "no-cache"
    js = client.get("/js/app.js")
    assert js.headers["content-type"].startswith("text/javascript")
    assert client.get("/vendor/katex/fonts/KaTeX_Main-Regular.woff2").headers["content-type"] == "font/woff2"
    again = client.get("/css/app.css", headers={"If-None-Match": client.get("/css/app.css").headers["etag"]})
    assert again.status_code == 304
    assert client.get("/nope.js").status_code == 404
