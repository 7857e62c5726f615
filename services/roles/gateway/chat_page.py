"""`GET /` on node 0: a small chat page (services/roles/gateway/chat/, plain HTML, CSS and JavaScript,
no build step) holding a conversation with `/query`: streamed answers, each with its sources,
sentiment and toxicity, 503s retried after Retry-After, a stop button, and an API-key field when
keys are on. The page and its two files are open (as /health is); the questions it sends need a key
where keys are on."""
from __future__ import annotations

from pathlib import Path

from flask import Flask, Response, abort

CHAT_DIR = Path(__file__).with_name("chat")
FILES = {"chat.js": "text/javascript; charset=utf-8", "chat.css": "text/css; charset=utf-8"}
# Only the page's own files and its own origin: a reply's text can never run as script.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def register_chat_page(app: Flask, api_keys_on: bool) -> None:
    page = (CHAT_DIR / "index.html").read_text(encoding="utf-8").replace("{{API_KEYS}}", "on" if api_keys_on else "off")
    assets = {name: (CHAT_DIR / name).read_bytes() for name in FILES}

    @app.get("/")
    def chat_page():
        return Response(page, mimetype="text/html", headers=SECURITY_HEADERS)

    @app.get("/chat/<name>")
    def chat_asset(name: str):
        if name not in assets:
            abort(404)
        return Response(assets[name], content_type=FILES[name], headers=SECURITY_HEADERS)
