// The chat page: a conversation with the gateway's /query, streamed as Server-Sent Events (docs/api.md).
// Every earlier turn is sent as `history`; each answer shows its sources, sentiment and toxicity.
"use strict";

const RETRIES = 5;            // 503s retried per question, each after the server's Retry-After
const MAX_WAIT_S = 30;        // the longest Retry-After honoured

const $ = (id) => document.getElementById(id);
const turns = [];             // the conversation so far: {role, content}, as /query's history takes it
let running = null;           // the AbortController of the answer being streamed

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;  // text only: nothing a reply holds becomes markup
  return node;
}

function status(text) { $("status").textContent = text; }

function requestId() {
  if (window.crypto && crypto.randomUUID) return "chat-" + crypto.randomUUID();
  return "chat-" + Date.now().toString(36) + "-" + Math.random().toString(36).slice(2);
}

function headers() {
  const h = { "Content-Type": "application/json", "Accept": "text/event-stream" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => { clearTimeout(timer); reject(new DOMException("stopped", "AbortError")); });
  });
}

// The events of an SSE body, as {name, data} (event names default to "message"; comments skipped).
async function* events(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "event") name = value;
        else if (field === "data") data.push(value);
      }
      if (data.length) yield { name, data: data.join("\n") };
    }
  }
}

function showMeta(answer, reply) {
  const meta = el("div", "meta");
  meta.append(el("span", "badge sentiment", "sentiment: " + reply.sentiment));
  const toxic = String(reply.is_toxic) === "true";
  meta.append(el("span", "badge toxicity" + (toxic ? " toxic" : ""), toxic ? "toxic" : "not toxic"));
  if (reply.history_turns_dropped > 0) {
    meta.append(el("span", "dropped", reply.history_turns_dropped + " earlier turn(s) left out to fit the context"));
  }
  const sources = Array.isArray(reply.sources) ? reply.sources : [];
  if (sources.length) {
    const list = el("ol", "sources");
    for (const source of sources) {
      const item = el("li", "source");
      const title = source.title || source.document || String(source.id);
      let url = null;
      try { url = source.url ? new URL(source.url, location.href) : null; } catch (e) { url = null; }
      if (url && (url.protocol === "http:" || url.protocol === "https:")) {
        const link = el("a", "title", title);
        link.href = url.href;
        link.target = "_blank";
        link.rel = "noopener noreferrer";
        item.append(link);
      } else {
        item.append(el("span", "title", title));
      }
      if (source.heading && source.heading !== title) item.append(el("span", "heading", " — " + source.heading));
      list.append(item);
    }
    meta.append(el("div", "sources-label", "Sources:"), list);
  }
  answer.append(meta);
}

// One POST /query, retried on 503 after Retry-After; the response once it is not a 503.
async function post(body, signal) {
  for (let attempt = 1; ; attempt++) {
    const response = await fetch("/query", { method: "POST", headers: headers(), body: JSON.stringify(body), signal });
    if (response.status !== 503 || attempt > RETRIES) return response;
    const wait = Math.min(MAX_WAIT_S, Math.max(1, Number(response.headers.get("Retry-After")) || 1));
    status(`The service is busy; retrying in ${wait} s (attempt ${attempt + 1} of ${RETRIES + 1})`);
    await sleep(wait * 1000, signal);
  }
}

async function errorText(response) {
  try {
    const body = await response.json();
    const error = body.error;
    return typeof error === "string" ? error : (error && error.message) || JSON.stringify(body);
  } catch (e) {
    return response.statusText;
  }
}

async function ask(question) {
  const log = $("log");
  log.append(el("div", "turn user", question));
  const answer = el("div", "turn assistant");
  answer.dataset.state = "waiting";
  const text = el("div", "text");
  answer.append(text);
  log.append(answer);
  answer.scrollIntoView({ block: "end" });

  const controller = new AbortController();
  running = controller;
  $("stop").disabled = false;
  $("send").disabled = true;
  const body = { request_id: requestId(), query: question, stream: true, history: turns.slice() };
  let reply = null;
  try {
    const response = await post(body, controller.signal);
    status("");
    if (response.status === 401) {
      $("key-row").hidden = false;
      throw new Error("This service needs an API key (or the one given is wrong): enter it above.");
    }
    if (!response.ok) throw new Error(`${response.status}: ${await errorText(response)}`);
    answer.dataset.state = "streaming";
    for await (const event of events(response.body)) {
      const data = JSON.parse(event.data);
      if (event.name === "token") {
        text.textContent += data.text;
      } else if (event.name === "reply") {
        reply = data;
        text.textContent = data.generated_response;
      } else if (event.name === "error") {
        throw new Error(`${data.status}: ${data.error}`);
      }
    }
    if (reply === null) throw new Error("The answer's stream ended before its reply.");
    showMeta(answer, reply);
    answer.dataset.state = "done";
    turns.push({ role: "user", content: question }, { role: "assistant", content: reply.generated_response });
  } catch (error) {
    if (error.name === "AbortError") {
      answer.dataset.state = "stopped";
      status("Stopped.");
      // What was shown stays the conversation's: the next question may refer to it.
      if (text.textContent) turns.push({ role: "user", content: question }, { role: "assistant", content: text.textContent });
    } else {
      answer.dataset.state = "failed";
      answer.append(el("div", "meta error", error.message));
    }
  } finally {
    if (running === controller) running = null;
    $("stop").disabled = true;
    $("send").disabled = false;
    answer.scrollIntoView({ block: "end" });
  }
}

function start() {
  if (document.body.dataset.apiKeys === "on") $("key-row").hidden = false;
  $("api-key").value = sessionStorage.getItem("rag-api-key") || "";
  $("api-key").addEventListener("change", () => sessionStorage.setItem("rag-api-key", $("api-key").value.trim()));
  $("ask").addEventListener("submit", (event) => {
    event.preventDefault();
    const question = $("question").value.trim();
    if (!question || running) return;
    $("question").value = "";
    ask(question);
  });
  $("question").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("ask").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => { if (running) running.abort(); });
  $("new-chat").addEventListener("click", () => {
    if (running) running.abort();
    turns.length = 0;
    $("log").replaceChildren();
    status("");
  });
}

document.addEventListener("DOMContentLoaded", start);
