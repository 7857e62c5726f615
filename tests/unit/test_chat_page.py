"""The chat page's routes (services/roles/gateway/chat_page.py) on a Flask app: the page says whether
keys are on, its two files come with their types and the strict policy, nothing else is served."""
from __future__ import annotations

import pytest
from flask import Flask

from services.roles.gateway.chat_page import CHAT_DIR, register_chat_page


@pytest.mark.parametrize("keys_on", [True, False])
def test_the_page_says_whether_keys_are_on(keys_on):
    app = Flask(__name__)
    register_chat_page(app, api_keys_on=keys_on)
    page = app.test_client().get("/")
    assert page.status_code == 200 and page.mimetype == "text/html"
    assert f'data-api-keys="{"on" if keys_on else "off"}"' in page.get_data(as_text=True)
    assert "{{" not in page.get_data(as_text=True)
    policy = page.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "connect-src 'self'" in policy


def test_its_files_and_nothing_else():
    app = Flask(__name__)
    register_chat_page(app, api_keys_on=False)
    client = app.test_client()
    for name, mimetype in (("chat.js", "text/javascript"), ("chat.css", "text/css")):
        asset = client.get(f"/chat/{name}")
        assert asset.status_code == 200 and asset.mimetype == mimetype
        assert asset.data == (CHAT_DIR / name).read_bytes()
        assert asset.headers["X-Content-Type-Options"] == "nosniff"
    for other in ("index.html", "..%2Fchat_page.py", "missing.js"):
        assert client.get(f"/chat/{other}").status_code == 404


def test_the_script_writes_reply_text_as_text_only():
    # A reply's text, titles and headings are the model's and the documents': never markup.
    script = (CHAT_DIR / "chat.js").read_text(encoding="utf-8")
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script and "document.write" not in script
