"""The chat page (`GET /` on node 0) in a real headless Chromium (Debian's chromium and chromium-driver,
driven by Selenium) against a three-node cluster on 127.0.0.1 serving an ingested folder, with API keys
on and room for one request at a time (GATEWAY_MAX_IN_FLIGHT=1): the key typed in its field; a
two-turn conversation answered, each answer with its sources (titles linked to their URLs), sentiment
and toxicity, the second question sent with the first turn as its history; a question met by a 503
while another request holds the gateway, retried after Retry-After and answered; a streaming answer
stopped with the Stop button, its generation cancelled on the node. The page's screenshot is saved in
logs/test-artifacts/chat-page.png.

Workers are tests.support.slow_generate_node: questions holding its marker are written slowly (so a
reader can stop them, or hold the gateway), every other one as the model writes it. The stand-in
embedder has random weights: a question finds a passage for sure only when it is that passage's text."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import requests

from pipeline import spec
from pipeline.config import REPO_ROOT
from profiling.lib.prometheus import scrape
from tests.helpers import TEST_ENV, start_cluster, uid, wait_until
from tests.support.slow_generate_node import MARKER

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra)")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
KEY = "chat-page-key-0123456789"
BASE_URL = "https://help.example.com/"
DOCS = {"returns.md": ("Returns", "Returns are accepted within thirty days of delivery with the receipt."),
        "shipping.md": ("Shipping", "The warehouse ships parcels every weekday morning before nine.")}
ANSWERED_S = 240  # a tiny stand-in answers in seconds; the bound is for a busy machine
SCREENSHOT = REPO_ROOT / "logs" / "test-artifacts" / "chat-page.png"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat-page")
    src = root / "src"
    src.mkdir()
    for name, (title, text) in DOCS.items():
        (src / name).write_text(f"# {title}\n\n{text}\n")
    result = subprocess.run([sys.executable, "-m", "builders.ingest", str(src), "--out", str(root / "v1"),
                             "--no-progress", "--base-url", BASE_URL],
                            env={**os.environ, **TEST_ENV}, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    keys = root / "keys"
    keys.write_text(f"{KEY}\n")
    data = SimpleNamespace(index_path=root / "v1" / "faiss_index.bin", db_path=root / "v1" / "documents" / "documents.db")
    worker = [sys.executable, "-m", "tests.support.slow_generate_node"]
    cluster = start_cluster(data, root / "logs", commands={0: worker, 1: worker},
                            API_KEYS_FILE=str(keys), GATEWAY_MAX_IN_FLIGHT="1")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("Debian's chromium and chromium-driver are not installed (deploy/install-browser.sh installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1000,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})  # the requests' bodies
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    yield driver
    driver.quit()


def answers(driver) -> list:
    return driver.find_elements(By.CSS_SELECTOR, ".turn.assistant")


def ask(driver, question: str) -> None:
    box = driver.find_element(By.ID, "question")
    box.send_keys(question)
    driver.find_element(By.ID, "send").click()


def settled(driver, count: int, timeout: float = ANSWERED_S):
    """The count-th answer once it is no longer waiting or streaming."""
    WebDriverWait(driver, timeout).until(
        lambda d: len(answers(d)) >= count and answers(d)[count - 1].get_attribute("data-state") in ("done", "failed", "stopped"))
    return answers(driver)[count - 1]


def sent_bodies(driver) -> list[dict]:
    """The bodies of the POST /query requests the page has sent since the last call."""
    bodies = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            sent = message["params"]["request"]
            if sent["url"].endswith("/query") and sent["method"] == "POST":
                bodies.append(json.loads(sent["postData"]))
    return bodies


def cancelled(cluster) -> float:
    """The generations both workers have cancelled (their readers gone)."""
    total = 0.0
    for node in (0, 1):
        snapshot = scrape(f"{cluster.url(node)}/metrics")
        assert not snapshot.error, snapshot.error
        total += snapshot.get("rag_generate_cancelled_sequences_total", stage="generate") or 0.0
    return total


def check_answer(answer, title: str) -> None:
    assert answer.get_attribute("data-state") == "done", answer.text
    assert answer.find_element(By.CLASS_NAME, "text").text.strip()
    links = {a.text: a.get_attribute("href") for a in answer.find_elements(By.CSS_SELECTOR, ".sources a.title")}
    assert title in links and links[title].startswith(BASE_URL), links
    assert answer.find_element(By.CSS_SELECTOR, ".badge.sentiment").text in {f"sentiment: {s}" for s in spec.SENTIMENTS}
    assert answer.find_element(By.CSS_SELECTOR, ".badge.toxicity").text in ("toxic", "not toxic")


def test_a_conversation_in_the_browser(cluster, browser):
    browser.get(f"{cluster.url(0)}/")
    key_field = browser.find_element(By.ID, "api-key")
    assert key_field.is_displayed()  # keys are on: the page asks for one
    key_field.send_keys(KEY)
    sent_bodies(browser)  # from here on

    first_question, first_title = DOCS["returns.md"][1], DOCS["returns.md"][0]
    ask(browser, first_question)
    first = settled(browser, 1)
    check_answer(first, first_title)
    first_text = first.find_element(By.CLASS_NAME, "text").text

    second_question, second_title = DOCS["shipping.md"][1], DOCS["shipping.md"][0]
    ask(browser, second_question)
    check_answer(settled(browser, 2), second_title)
    bodies = sent_bodies(browser)
    assert [b["query"] for b in bodies] == [first_question, second_question]
    assert bodies[0]["history"] == [] and bodies[1]["history"][0] == {"role": "user", "content": first_question}
    assert bodies[1]["history"][1]["role"] == "assistant"
    assert bodies[1]["history"][1]["content"].strip() == first_text.strip()

    # A 503: another client holds node 0's one place; the page waits Retry-After and asks again.
    held = requests.post(f"{cluster.url(0)}/query", headers={"Authorization": f"Bearer {KEY}"}, stream=True, timeout=300,
                         json={"request_id": uid("hold"), "query": f"Hold the gateway {MARKER}", "stream": True})
    assert held.status_code == 200
    next(held.iter_lines())  # its first event: it is generating
    ask(browser, first_question)
    WebDriverWait(browser, ANSWERED_S).until(lambda d: "retrying" in d.find_element(By.ID, "status").text)
    held.close()  # the reader leaves: its generation is cancelled and the place frees
    check_answer(settled(browser, 3), first_title)
    assert len(sent_bodies(browser)) >= 2  # the 503 and the retry, the same body each time

    # Stop: an answer still streaming, stopped by the button; its generation is cancelled on the node.
    before = cancelled(cluster)
    ask(browser, f"Tell me about parcels {MARKER}")
    WebDriverWait(browser, ANSWERED_S).until(
        lambda d: len(answers(d)) == 4 and answers(d)[3].get_attribute("data-state") == "streaming"
        and answers(d)[3].find_element(By.CLASS_NAME, "text").text.strip())
    browser.find_element(By.ID, "stop").click()
    assert settled(browser, 4, timeout=30).get_attribute("data-state") == "stopped"
    wait_until(lambda: cancelled(cluster) > before, timeout_s=60, what="the stopped answer's generation cancelled")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(SCREENSHOT))


def test_the_page_and_its_files_are_served_with_a_strict_policy(cluster):
    page = requests.get(f"{cluster.url(0)}/", timeout=30)
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["Content-Security-Policy"] and 'data-api-keys="on"' in page.text
    for name, kind in (("chat.js", "text/javascript"), ("chat.css", "text/css")):
        asset = requests.get(f"{cluster.url(0)}/chat/{name}", timeout=30)
        assert asset.status_code == 200 and asset.headers["Content-Type"].startswith(kind)
    assert requests.get(f"{cluster.url(0)}/chat/index.html", timeout=30).status_code == 404
    assert requests.get(f"{cluster.url(1)}/", timeout=30).status_code == 404  # the page is the gateway's
