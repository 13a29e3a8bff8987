// troupe's web page: sign in with a token, list threads and runs, talk to an
// agent, and watch each answer's reasoning block live. The block's state is the
// daemon's (`block` frames of `GET /v1/runs/{id}/events?view=block`); this page
// only draws it and runs its timer. Plain DOM, no dependency.
"use strict";

const TOKEN_KEY = "troupe-token";
const state = { token: sessionStorage.getItem(TOKEN_KEY), streams: new Map(), agents: [] };
const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || `HTTP ${status}`);
    this.status = status;
    this.code = body && body.code;
  }
}

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${state.token}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await response.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch (_) { json = null; }
  if (response.status === 401) signOut("That token was not accepted.");
  if (!response.ok) throw new ApiError(response.status, json);
  return json;
}

// ---- sign in -------------------------------------------------------------

// Back to the sign-in form; `keep` keeps the tab's token (the daemon was not
// reachable: a reload tries it again).
function signOut(message, keep = false) {
  if (!keep) sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
  for (const stream of state.streams.values()) stream.close();
  state.streams.clear();
  $("app").hidden = true;
  $("signin").hidden = false;
  $("signin-error").textContent = message || "";
  $("token").focus();
}

async function signIn(token) {
  state.token = token;
  try {
    state.agents = await api("GET", "/v1/agents");
  } catch (error) {
    if (error.status === 401) signOut("That token was not accepted.");
    else signOut(`Cannot reach the daemon: ${error.message}`, true);
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  $("signin").hidden = true;
  $("app").hidden = false;
  const select = $("agent");
  select.replaceChildren(...state.agents.map((agent) => el("option", { value: agent.name }, agent.name)));
  await refreshLists();
  route();
}

// ---- lists ---------------------------------------------------------------

async function refreshLists() {
  try {
    const [threads, runs] = await Promise.all([api("GET", "/v1/threads?limit=50"), api("GET", "/v1/runs?limit=50")]);
    $("threads").replaceChildren(...threads.threads.map((thread) => el("li", {},
      el("a", { href: `#/threads/${thread.thread_id}` }, threadTitle(thread)))));
    $("runs").replaceChildren(...runs.runs.map((run) => el("li", {},
      el("a", { href: `#/runs/${run.run_id}`, title: run.input }, run.input.slice(0, 60), " ",
        el("span", { class: "status" }, run.status)))));
    $("runs").dataset.loaded = "true";
    markCurrent();
  } catch (error) {
    showError(error);
  }
}

function threadTitle(thread) {
  const title = thread.metadata && thread.metadata.title;
  return typeof title === "string" && title ? title : `Conversation of ${new Date(thread.created_at).toLocaleString()}`;
}

function markCurrent() {
  for (const link of document.querySelectorAll(".list a")) {
    if (link.getAttribute("href") === location.hash) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

// ---- routes --------------------------------------------------------------

let current = { kind: "new" };
// Bumped by each route change: an earlier route still loading sees it and stops.
let routeNumber = 0;
const stale = (number) => number !== routeNumber;

async function route() {
  if (!state.token) return;
  const number = ++routeNumber;
  for (const stream of state.streams.values()) stream.close();
  state.streams.clear();
  closeInspector();
  showError(null);
  $("conversation").replaceChildren();
  const [, kind, id] = location.hash.match(/^#\/(threads|runs)\/([\w-]+)$/) || [];
  markCurrent();
  if (kind === "threads") {
    current = { kind: "thread", id };
    await openThread(id, number);
  } else if (kind === "runs") {
    current = { kind: "run", id };
    await openRun(id, number);
  } else {
    current = { kind: "new" };
    $("view-title").textContent = "New conversation";
    $("composer").hidden = false;
    $("agent").disabled = false;
  }
}

async function openThread(id, number) {
  try {
    const thread = await api("GET", `/v1/threads/${id}`);
    const runs = await api("GET", `/v1/threads/${id}/runs?limit=50`);
    if (stale(number)) return;
    $("view-title").textContent = threadTitle(thread);
    $("agent").value = thread.agent;
    $("agent").disabled = true;
    $("composer").hidden = false;
    for (const run of runs.runs.slice().reverse()) addTurn(run);
  } catch (error) {
    if (stale(number)) return;
    $("view-title").textContent = "Conversation";
    $("composer").hidden = true;
    showError(error);
  }
}

async function openRun(id, number) {
  try {
    const run = await api("GET", `/v1/runs/${id}`);
    if (stale(number)) return;
    $("view-title").textContent = `Run ${run.run_id}`;
    $("composer").hidden = true;
    addTurn(run);
  } catch (error) {
    if (stale(number)) return;
    $("view-title").textContent = "Run";
    $("composer").hidden = true;
    showError(error);
  }
}

function showError(error) {
  if (!error) { $("view-error").textContent = ""; return; }
  const text = error.status === 404 ? "Not found: there is no such conversation or run for this token."
    : error.message;
  $("view-error").textContent = text;
}

async function send(text) {
  showError(null);
  const agent = $("agent").value || undefined;
  try {
    if (current.kind === "thread") {
      // A message sent while the agent works waits for it; one sent while the
      // agent waits for an answer or an approval takes its place (as in troupe chat).
      const waiting = document.querySelector("#conversation .ask") !== null;
      const multitask_strategy = waiting ? "interrupt" : "enqueue";
      const run = await api("POST", `/v1/threads/${current.id}/runs`, { input: text, multitask_strategy });
      addTurn(run);
    } else {
      const thread = await api("POST", "/v1/threads", { agent, metadata: { title: text.slice(0, 60) } });
      const run = await api("POST", `/v1/threads/${thread.thread_id}/runs`, { input: text });
      history.replaceState(null, "", `#/threads/${thread.thread_id}`);
      current = { kind: "thread", id: thread.thread_id };
      $("view-title").textContent = threadTitle(thread);
      $("agent").disabled = true;
      addTurn(run);
    }
    refreshLists();
  } catch (error) {
    showError(error);
  }
}

// ---- one run: the question, the block, the answer --------------------------

const FINISHED = ["succeeded", "failed", "cancelled", "timed_out", "budget_exceeded", "interrupted"];

function addTurn(run) {
  const turn = new Turn(run);
  $("conversation").append(turn.node);
  turn.follow();
  return turn;
}

class Turn {
  constructor(run) {
    this.run = run;
    this.block = null;
    this.offset = 0;
    this.expanded = false;
    this.answer = "";
    this.failure = "";
    // Seen while it ran (not replayed): its end changes the lists.
    this.live = !FINISHED.includes(run.status);
    const id = run.run_id;
    this.title = el("span", { class: "block-title" }, "Waiting to start");
    this.head = el("button", { class: "block-head", type: "button", "aria-expanded": "false",
      "aria-controls": `steps-${id}`, onclick: () => this.toggle() }, this.title);
    this.latest = el("ol", { class: "block-latest" });
    this.steps = el("ol", { class: "block-steps", id: `steps-${id}`, hidden: true });
    this.blockNode = el("div", { class: "block", "data-phase": "idle" }, this.head, this.latest, this.steps);
    this.plan = el("ul", { class: "plan", "aria-label": "Plan", hidden: true });
    this.answerNode = el("div", { class: "answer" });
    this.citations = el("ol", { class: "citations", hidden: true });
    this.asks = el("div", { class: "asks" });
    this.cancelButton = el("button", { type: "button", class: "link cancel", onclick: () => this.cancel() }, "Cancel");
    this.status = el("span", { class: "run-status" }, run.status);
    const tools = el("div", { class: "run-tools" }, this.status, this.cancelButton,
      el("button", { type: "button", class: "link inspect", onclick: () => inspect(this) }, "Inspect"));
    this.node = el("li", { class: "turn", "data-run-id": id },
      el("div", { class: "user" }, run.input),
      el("div", { class: "assistant" }, this.blockNode, this.plan, this.asks, this.answerNode, this.citations, tools));
    this.node.turn = this;
    this.events = [];
  }

  follow() {
    const stream = new EventStream(this.run.run_id, (name, data) => this.on(name, data));
    state.streams.set(this.run.run_id, stream);
    stream.start();
  }

  on(name, data) {
    if (name === "block") {
      this.offset = Date.parse(data.server_time) - Date.now();
      this.block = data;
      this.answer = data.answer;
      this.draw();
      return;
    }
    this.events.push(data);
    if (inspected === this) inspectEvent(data);
    switch (name) {
      case "assistant_delta":
        if (!data.reasoning && this.block && this.block.phase !== "reasoning") {
          this.answer += data.text;
          this.answerNode.textContent = this.answer;
        }
        break;
      case "approval_requested": this.askApproval(data); break;
      case "approval_decided": this.removeAsk(data.call_id); this.removeAsk("input"); break;
      case "waiting_input":
        // A run parked on approvals asks through their buttons, not a text box.
        if (!this.asks.querySelector(".ask.approval")) this.askInput(data);
        break;
      case "input_received": this.removeAsk("input"); break;
      case "final_output": this.showCitations(data.citations || []); break;
      case "run_end":
        this.status.textContent = data.status + (data.reason ? `: ${data.reason}` : "");
        this.cancelButton.hidden = true;
        this.asks.replaceChildren();
        if (data.status !== "succeeded") {
          this.failure = `The run ${data.status.replace("_", " ")}${data.reason ? `: ${data.reason}` : ""}.`;
          this.showAnswer();
        }
        if (this.live) refreshLists();
        break;
      case "turn_start": this.status.textContent = "running"; break;
      default: break;
    }
  }

  draw() {
    const block = this.block;
    this.blockNode.dataset.phase = block.phase;
    this.title.textContent = this.titleText();
    const headlines = block.steps.filter((step) => step.headline).slice(-2);
    this.latest.replaceChildren(...headlines.map((step) => el("li", {}, step.summary)));
    this.latest.hidden = block.phase !== "reasoning";
    this.steps.replaceChildren(...block.steps.map(stepNode));
    this.showAnswer();
    if (block.plan && block.plan.items.length) {
      this.plan.hidden = false;
      this.plan.replaceChildren(...block.plan.items.map((item) => el("li", { class: item.status }, item.content)));
    }
    if (block.phase === "complete" || FINISHED.includes(block.status)) this.cancelButton.hidden = true;
  }

  // The answer so far; a run that ended without one says how it ended.
  showAnswer() {
    const reasoning = this.block && this.block.phase === "reasoning";
    const failed = !this.answer && this.failure;
    this.answerNode.classList.toggle("failed", Boolean(failed));
    this.answerNode.textContent = failed ? this.failure : reasoning ? "" : this.answer;
  }

  titleText() {
    const block = this.block;
    if (!block || block.phase === "idle") return "Waiting to start";
    if (block.phase === "reasoning" && (block.waiting || !block.reasoning_since)) {
      return `Waiting for you · reasoned ${seconds(block.thought_ms)}`;
    }
    if (block.phase === "reasoning") {
      const since = Date.parse(block.reasoning_since);
      const ms = block.thought_ms + Math.max(0, Date.now() + this.offset - since);
      return `Reasoning · ${Math.floor(ms / 1000)}s`;
    }
    return `Thought for ${seconds(block.thought_ms)}`;
  }

  tick() {
    if (this.block && this.block.phase === "reasoning") this.title.textContent = this.titleText();
  }

  toggle() {
    this.expanded = !this.expanded;
    this.head.setAttribute("aria-expanded", String(this.expanded));
    this.steps.hidden = !this.expanded;
  }

  askApproval(event) {
    this.removeAsk(event.call_id);
    const reason = el("input", { type: "text", placeholder: "Why (optional, for a rejection)", "aria-label": "Reason" });
    const decide = async (approve) => {
      try {
        const body = { approve, call_id: event.call_id };
        if (!approve && reason.value.trim()) body.reason = reason.value.trim();
        await api("POST", `/v1/runs/${this.run.run_id}/input`, body);
        this.removeAsk(event.call_id);
      } catch (error) { showError(error); }
    };
    this.asks.append(el("div", { class: "ask approval", "data-call-id": event.call_id, role: "group",
      "aria-label": `Approve ${event.tool}` },
      el("div", {}, el("strong", {}, event.tool), " waits for your approval: ", event.reason),
      el("pre", {}, JSON.stringify(event.args, null, 2)),
      el("div", { class: "row" }, reason,
        el("button", { type: "button", class: "approve", onclick: () => decide(true) }, "Approve"),
        el("button", { type: "button", class: "secondary reject", onclick: () => decide(false) }, "Reject"))));
  }

  askInput(event) {
    this.removeAsk("input");
    const input = el("input", { type: "text", "aria-label": "Your answer", required: true });
    const form = el("form", { class: "row", onsubmit: async (submit) => {
      submit.preventDefault();
      try {
        await api("POST", `/v1/runs/${this.run.run_id}/input`, { text: input.value });
        this.removeAsk("input");
      } catch (error) { showError(error); }
    } }, input, el("button", { type: "submit" }, "Answer"));
    this.asks.append(el("div", { class: "ask question", "data-call-id": "input" }, el("div", {}, event.prompt), form));
    input.focus();
  }

  removeAsk(id) {
    for (const node of this.asks.querySelectorAll(".ask")) if (node.dataset.callId === id) node.remove();
  }

  showCitations(citations) {
    this.citations.hidden = citations.length === 0;
    this.citations.replaceChildren(...citations.map((citation) => {
      const fragment = citation.fragment;
      const title = fragment.title || fragment.id;
      const web = /^https?:\/\//.test(fragment.source);
      const source = web ? el("a", { href: fragment.source, target: "_blank", rel: "noopener noreferrer" }, fragment.source)
        : el("span", {}, fragment.source);
      return el("li", { value: citation.marker },
        el("details", {}, el("summary", {}, title), el("p", {}, fragment.snippet || ""), source));
    }));
  }

  async cancel() {
    try { await api("POST", `/v1/runs/${this.run.run_id}/cancel`); } catch (error) { showError(error); }
  }
}

function stepNode(step) {
  const meta = [step.status, step.duration_ms !== undefined ? `${step.duration_ms} ms` : null].filter(Boolean).join(" · ");
  return el("li", { class: step.kind, "data-seq": step.seq },
    el("span", { class: "kind" }, step.kind), step.summary,
    meta ? el("span", { class: "meta" }, ` · ${meta}`) : null,
    step.detail ? el("pre", {}, step.detail) : null);
}

function seconds(ms) {
  const s = Math.floor(ms / 1000);
  return s < 60 ? `${s}s` : `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
}

// ---- event streams: fetch (for the Authorization header), resumed with Last-Event-ID

class EventStream {
  constructor(runId, onEvent) {
    this.runId = runId;
    this.url = `/v1/runs/${runId}/events?view=block`;
    this.onEvent = onEvent;
    this.lastId = null;
    this.closed = false;
    this.ended = false;
    this.controller = null;
    this.failures = 0;
  }

  close() {
    this.closed = true;
    if (this.controller) this.controller.abort();
  }

  async start() {
    while (!this.closed && !this.ended) {
      const before = this.lastId;
      try {
        await this.read();
      } catch (error) {
        if (this.closed) return;
        if (error instanceof ApiError && error.status !== 429 && error.status < 500) { showError(error); return; }
      }
      if (this.closed || this.ended) return;
      // A connection that brought nothing new backs off, and stops if the run has
      // ended (its session is gone: nothing more will come).
      if (this.lastId === before) {
        this.failures += 1;
        try {
          const run = await api("GET", `/v1/runs/${this.runId}`);
          if (FINISHED.includes(run.status) && this.failures > 2) return;
        } catch (_) { /* unreachable: try again */ }
      } else {
        this.failures = 0;
      }
      await new Promise((resolve) => setTimeout(resolve, Math.min(5000, 250 * 2 ** this.failures)));
    }
  }

  // Reads one connection, until it ends or `run_end` came.
  async read() {
    this.controller = new AbortController();
    const headers = { Authorization: `Bearer ${state.token}`, Accept: "text/event-stream" };
    if (this.lastId !== null) headers["Last-Event-ID"] = this.lastId;
    const response = await fetch(this.url, { headers, signal: this.controller.signal, cache: "no-store" });
    if (!response.ok) {
      let body = null;
      try { body = await response.json(); } catch (_) { body = null; }
      throw new ApiError(response.status, body);
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let carry = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      // A \r at a chunk's end may be the first half of a \r\n.
      let text = carry + value;
      carry = text.endsWith("\r") ? "\r" : "";
      if (carry) text = text.slice(0, -1);
      buffer += text.replace(/\r\n?/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let name = "message", data = "", id = null;
        for (const line of frame.split("\n")) {
          if (line.startsWith(":")) continue;
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
          if (field === "event") name = text;
          else if (field === "data") data += (data ? "\n" : "") + text;
          else if (field === "id") id = text;
        }
        if (!data) continue;
        if (id !== null) this.lastId = id;
        let parsed;
        try { parsed = JSON.parse(data); } catch (_) { continue; }
        if (name === "stream_error") throw new Error(parsed.message);
        this.onEvent(name, parsed);
        if (name === "run_end") this.ended = true;
      }
    }
  }
}

// ---- inspector -------------------------------------------------------------

let inspected = null;

async function inspect(turn) {
  inspected = turn;
  $("inspector").hidden = false;
  $("app").classList.add("inspecting");
  $("inspector-id").textContent = turn.run.run_id;
  $("inspector-events").replaceChildren();
  for (const event of turn.events) inspectEvent(event);
  try {
    const run = await api("GET", `/v1/runs/${turn.run.run_id}`);
    const usage = run.usage || {};
    const facts = [["status", run.status + (run.reason ? ` (${run.reason})` : "")], ["agent", run.agent], ["turns", run.turn],
      ["tokens", `${usage.input_tokens || 0} in / ${usage.output_tokens || 0} out`],
      ["cost", `$${Number(usage.cost_usd || 0).toFixed(4)}`], ["created", new Date(run.created_at).toLocaleString()]];
    $("inspector-run").replaceChildren(...facts.flatMap(([name, value]) => [el("dt", {}, name), el("dd", {}, value)]));
  } catch (error) {
    showError(error);
  }
  $("inspector-close").focus();
}

function inspectEvent(event) {
  const time = new Date(event.ts).toLocaleTimeString();
  $("inspector-events").append(el("tr", {}, el("td", {}, event.seq), el("td", {}, time), el("td", {}, event.kind),
    el("td", {}, describe(event))));
}

function describe(event) {
  switch (event.kind) {
    case "tool_call_start": return `${event.tool} ${JSON.stringify(event.args)}`;
    case "tool_call_end": return `${event.tool} ${event.status} · ${event.duration_ms} ms · ${event.summary}`;
    case "tool_metric": return `${event.record.tool} ${event.record.status} · ${event.record.duration_ms} ms`;
    case "review": return `${event.review.recommendation} · quality ${event.review.quality_score.toFixed(2)}`;
    case "token_usage": return `${event.usage.input_tokens} in / ${event.usage.output_tokens} out`;
    case "reasoning_step": return event.summary;
    case "assistant_delta": return event.text;
    case "final_output": return event.text;
    case "run_end": return event.status + (event.reason ? `: ${event.reason}` : "");
    case "plan_updated": return `v${event.plan.version}: ${event.plan.items.length} tasks`;
    default: return "";
  }
}

function closeInspector() {
  inspected = null;
  $("inspector").hidden = true;
  $("app").classList.remove("inspecting");
}

// ---- start -------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("signin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    signIn($("token").value.trim());
  });
  $("signout").addEventListener("click", () => signOut());
  $("inspector-close").addEventListener("click", closeInspector);
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("message").value.trim();
    if (!text) return;
    $("message").value = "";
    send(text);
  });
  $("message").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  window.addEventListener("hashchange", route);
  setInterval(() => {
    for (const node of document.querySelectorAll(".turn")) if (node.turn) node.turn.tick();
  }, 250);
  if (state.token) signIn(state.token); else signOut();
});
