// busd web: draws the session snapshots busd sends over Server-Sent Events.
// Every figure (status line, summary, context) comes computed from the server,
// the same model `busd watch` renders, and so do the words a tab and a tool call
// are shown with (a session's label and state, a tool input's summary); only the
// live timers of thinking and tool blocks tick here, from their start time and
// the server's clock.
// Access is the session cookie busd web set when the printed URL was opened
// (HttpOnly: this script never sees it); answers are JSON POSTs, which the
// server takes from this origin only.
"use strict";

(() => {
  const state = {
    readOnly: false, // busd web --read-only: show, never answer nor cancel
    sessions: new Map(), // session_id -> snapshot
    selected: null,
    pinned: false, // the user chose this session (a tab, an answer, a cancel): stay on it
    wanted: null, // the #session_id of the address (a reload): open it once it is there
    offset: 0, // server clock minus ours, in seconds
    open: new Set(), // keys of expanded <details>
    posting: new Set(), // request ids and run ids with a POST in flight
    errors: new Map(), // request id or run id -> message of the last failed POST
  };

  try {
    state.wanted = decodeURIComponent(location.hash.slice(1)) || null;
  } catch {
    // not an address this page wrote: ignore it
  }

  const $nav = document.getElementById("sessions");
  const $main = document.getElementById("session");
  const $connection = document.getElementById("connection");
  const $name = document.getElementById("answering-as");

  // -- small helpers ------------------------------------------------------------------

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "testid") node.dataset.testid = value;
      else if (key === "class") node.className = value;
      else if (key === "data") Object.assign(node.dataset, value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // The same rules as busd.humanize.format_duration.
  function duration(seconds) {
    const total = seconds > 0 && Number.isFinite(seconds) ? Math.floor(seconds) : 0;
    if (total < 60) return `${total}s`;
    const minutes = Math.floor(total / 60);
    const pad = (n) => String(n).padStart(2, "0");
    if (minutes < 60) return `${minutes}m ${pad(total % 60)}s`;
    return `${Math.floor(minutes / 60)}h ${pad(minutes % 60)}m`;
  }

  const serverNow = () => Date.now() / 1000 + state.offset;

  function timer(startedTs) {
    return el(
      "span",
      { class: "timer", testid: "timer", data: { startedTs: String(startedTs) } },
      duration(serverNow() - startedTs),
    );
  }

  function details(key, summary, ...body) {
    const node = el("details", { open: state.open.has(key) }, el("summary", {}, summary), ...body);
    node.addEventListener("toggle", () => {
      if (node.open) state.open.add(key);
      else state.open.delete(key);
    });
    return node;
  }

  // -- blocks -------------------------------------------------------------------------

  function renderBlocks(view, blocks) {
    return blocks.map((block) => renderBlock(view, block));
  }

  function renderBlock(view, block) {
    switch (block.kind) {
      case "prompt":
        return el("div", { class: "block prompt", testid: "block-prompt" }, block.text);
      case "text":
        return el(
          "div",
          {
            class: "block text" + (block.done ? "" : " streaming"),
            testid: "block-text",
            data: { messageId: block.message_id, done: String(block.done) },
          },
          block.text,
          block.stopped ? el("span", { class: "stopped" }, " (stopped)") : null,
        );
      case "thinking": {
        const key = `${view.session_id}:thinking:${block.message_id}`;
        const head = block.done
          ? el("span", {}, `Thought for ${block.duration_s < 1 ? "<1s" : duration(block.duration_s)}`)
          : el("span", {}, "Thinking… ", timer(block.started_ts));
        return el(
          "div",
          { class: "block thinking", testid: "block-thinking", data: { done: String(block.done) } },
          details(key, head, el("div", { class: "thinking-text" }, block.text)),
        );
      }
      case "tool":
        return renderTool(view, block);
      case "permission":
        return renderPermission(view, block);
      case "agent":
        return renderAgent(view, block.agent_id);
      case "notice":
        return el(
          "div",
          { class: `block notice ${block.level}`, testid: "notice", data: { level: block.level } },
          block.text,
        );
      default:
        return null;
    }
  }

  const TOOL_MARK = { running: "…", ok: "✓", error: "✗", cancelled: "⊘", timed_out: "✗" };

  function renderTool(view, block) {
    const key = `${view.session_id}:tool:${block.tool_call_id}`;
    // A call whose permission request waits has not started: no timer until it is answered.
    const waiting = Boolean(block.waiting) && block.status === "running";
    let time = null;
    if (block.duration_s !== null && block.duration_s !== undefined) {
      time = el("span", { class: "timer" }, duration(block.duration_s));
    } else if (!waiting) {
      time = timer(block.started_ts);
    }
    // `Write(/path)`, as `busd watch` writes it: the summary is the server's.
    const call = el(
      "span",
      { class: "tool-call", testid: "tool-call" },
      el("span", { class: "tool-name", testid: "tool-name" }, block.name),
      block.summary
        ? el("span", { class: "tool-input", title: block.summary }, `(${block.summary})`)
        : null,
    );
    const head = el(
      "span",
      { class: "tool-head" },
      el("span", { class: "mark" }, TOOL_MARK[block.status] || "?"),
      call,
      el("span", { class: "tool-status", testid: "tool-status" },
        waiting ? "waiting for an answer" : block.status),
      time,
      block.timed_out ? el("span", { class: "warn" }, "over its time limit") : null,
    );
    const body = [el("pre", { class: "tool-io" }, JSON.stringify(block.input, null, 2))];
    if (block.output) body.push(el("pre", { class: "tool-io output" }, block.output));
    if (block.error) body.push(el("pre", { class: "tool-io error" }, block.error));
    return el(
      "div",
      {
        class: `block tool ${block.status}`,
        testid: "block-tool",
        data: { toolCallId: block.tool_call_id, status: block.status },
      },
      details(key, head, ...body),
      block.agents.map((agentId) => renderAgent(view, agentId)),
    );
  }

  function renderAgent(view, agentId) {
    const agent = view.agents[agentId];
    if (!agent) return null;
    return el(
      "div",
      { class: "agent", testid: "agent", data: { agentId, status: agent.status } },
      el(
        "div",
        { class: "agent-head" },
        el("span", { class: "agent-name" }, agent.name || agentId),
        agent.description ? el("span", { class: "agent-desc" }, agent.description) : null,
        el("span", { class: "agent-status" }, agent.status),
      ),
      renderBlocks(view, agent.blocks),
      agent.result ? el("div", { class: "agent-result" }, agent.result) : null,
    );
  }

  function renderPermission(view, block) {
    const id = block.request_id;
    const busy = state.posting.has(id);
    const card = el(
      "div",
      {
        class: `block permission ${block.state}`,
        testid: "permission",
        data: { requestId: id, state: block.state },
      },
      el(
        "div",
        { class: "permission-title" },
        `Allow ${block.tool}?`,
        block.title ? el("span", { class: "permission-about" }, ` ${block.title}`) : null,
      ),
      block.summary
        ? el("div", { class: "permission-input", testid: "permission-input" }, block.summary)
        : null,
    );
    if (block.state === "pending" && state.readOnly) {
      card.append(
        el("div", { class: "permission-resolution", testid: "permission-read-only" },
          "waiting for an answer (this page is read-only)"),
      );
    } else if (block.state === "pending") {
      const answer = (body) => () => postPermission(view.session_id, id, body);
      const options = block.options.length
        ? block.options.map((option) =>
            el(
              "button",
              {
                type: "button",
                class: option.kind && option.kind.startsWith("allow") ? "allow" : "deny",
                testid: "permission-option",
                data: { optionId: option.id, kind: option.kind || "other" },
                disabled: busy,
                onclick: answer({ option_id: option.id }),
              },
              option.label || option.id,
            ),
          )
        : [
            el(
              "button",
              { type: "button", class: "allow", testid: "permission-allow", disabled: busy,
                onclick: answer({ allow: true }) },
              "Allow",
            ),
            el(
              "button",
              { type: "button", class: "deny", testid: "permission-deny", disabled: busy,
                onclick: answer({ allow: false }) },
              "Deny",
            ),
          ];
      card.append(el("div", { class: "permission-options" }, options));
    } else {
      const by = block.by ? ` by ${block.by}` : "";
      const reason = block.reason ? ` (${block.reason})` : "";
      card.append(
        el("div", { class: "permission-resolution", testid: "permission-resolution" },
          `${block.state}${by}${reason}`),
      );
    }
    if (state.errors.has(id)) {
      card.append(el("div", { class: "error", testid: "permission-error" }, state.errors.get(id)));
    }
    return card;
  }

  // -- the session --------------------------------------------------------------------

  const NO_WINDOW =
    "busd does not know this model's context window, so there is no bar to fill: " +
    "[context.windows] in busd serve's config sets it (docs/accounting.md)";

  function renderContext(view) {
    const ctx = view.context;
    if (!ctx) return null;
    const line = view.context_line || "";
    if (!ctx.window) {
      // What it holds, and no bar: a bar needs a size to be a share of. The words
      // "window unknown" (the view model's, else ours) carry how to give it one.
      const unknown = () =>
        el("span", { class: "window-unknown", testid: "window-unknown", title: NO_WINDOW },
          "window unknown");
      const at = line.indexOf("window unknown");
      const words = at < 0
        ? [line, " · ", unknown()]
        : [line.slice(0, at), unknown(), line.slice(at + "window unknown".length)];
      return el(
        "div",
        { class: "context no-window", testid: "context", data: { used: String(ctx.used) } },
        el("div", { class: "context-line", testid: "context-line" }, ...words),
      );
    }
    const parts = ctx.breakdown || {};
    const known = (parts.system || 0) + (parts.tools || 0) + (parts.messages || 0);
    const segments = [
      ["system", parts.system || 0],
      ["tools", parts.tools || 0],
      ["messages", parts.messages || 0],
      ["other", Math.max(0, ctx.used - known)], // used but not broken down
      ["free", parts.free ?? Math.max(0, ctx.window - ctx.used)],
    ];
    const bar = el("div", {
      class: "context-bar",
      testid: "context-bar",
      role: "img",
      "aria-label": line,
      data: { used: String(ctx.used), window: String(ctx.window) },
    });
    for (const [name, value] of segments) {
      if (!value) continue;
      const segment = el("div", {
        class: `segment ${name}`,
        testid: `context-${name}`,
        title: `${name}: ${value.toLocaleString()} tokens`,
        data: { tokens: String(value) },
      });
      segment.style.width = `${Math.min(100, (value / ctx.window) * 100)}%`;
      bar.append(segment);
    }
    return el(
      "div",
      { class: "context", testid: "context" },
      bar,
      el("div", { class: "context-line", testid: "context-line" }, line),
    );
  }

  function renderSession(view) {
    const running = view.run_status === "running" && view.run_id && !state.readOnly;
    const runError = view.run_id ? state.errors.get(view.run_id) : null;
    return el(
      "section",
      { class: "session-view", testid: "session-view", data: { sessionId: view.session_id } },
      el(
        "div",
        { class: "session-head" },
        el("h2", { testid: "session-title", title: view.label || null },
          view.label || view.session_id),
        el(
          "div",
          { class: "meta" },
          view.label ? el("span", { class: "session-id", testid: "session-id" }, view.session_id)
            : null,
          view.model ? el("span", { testid: "session-model" }, view.model) : null,
          view.adapter ? el("span", { testid: "session-adapter" }, view.adapter) : null,
          view.run_status
            ? el("span", { class: `run-status ${view.run_status}`, testid: "run-status" },
                view.run_status)
            : null,
          view.cancelled_by ? el("span", {}, `cancelled by ${view.cancelled_by}`) : null,
          running
            ? el(
                "button",
                {
                  type: "button",
                  class: "cancel",
                  testid: "cancel-run",
                  disabled: state.posting.has(view.run_id),
                  onclick: () => postCancel(view.session_id, view.run_id),
                },
                "Cancel run",
              )
            : null,
        ),
        runError ? el("div", { class: "error", testid: "cancel-error" }, runError) : null,
        renderContext(view),
      ),
      el("div", { class: "blocks", testid: "blocks" }, renderBlocks(view, view.main.blocks)),
      el("div", { class: "status-line", testid: "status-line", hidden: !view.status_line },
        view.status_line || ""),
      el("div", { class: "summary-line", testid: "summary-line", hidden: !view.summary_line },
        view.summary_line || ""),
      el("div", { class: "tools-line", testid: "tools-line", hidden: !view.tools_line },
        view.tools_line || ""),
    );
  }

  // A session's state (the server's word for it) as its tab says it.
  const STATE_TEXT = {
    waiting: "waiting for you",
    running: "running",
    done: "done",
    cancelled: "cancelled",
    failed: "failed",
    idle: "idle",
  };

  function stateText(view) {
    if (view.state === "waiting" && state.readOnly) return "waiting for an answer";
    return STATE_TEXT[view.state] || view.state || "";
  }

  function stateDetail(view) {
    if (view.run_status === "timed_out") return "the run timed out";
    if (view.finished && view.finished.error) return view.finished.error;
    if (view.cancelled_by) return `cancelled by ${view.cancelled_by}`;
    return view.status_line || view.summary_line || null;
  }

  function renderTab(view) {
    const pending = countPending(view);
    const label = view.label || view.session_id;
    const agent = [view.adapter, view.model].filter(Boolean).join(" · ");
    return el(
      "button",
      {
        type: "button",
        class: `tab ${view.state || ""}` + (view.session_id === state.selected ? " active" : ""),
        testid: "session-tab",
        title: view.label ? `${view.label}\n${view.session_id}` : view.session_id,
        "aria-current": view.session_id === state.selected ? "true" : null,
        data: { sessionId: view.session_id, busy: String(view.busy), state: view.state || "" },
        onclick: () => {
          choose(view.session_id);
          render();
        },
      },
      el("span", { class: "tab-dot", "aria-hidden": "true" }),
      el("span", { class: "tab-title", testid: "tab-title" }, label),
      pending ? el("span", { class: "badge", testid: "pending-count" }, String(pending)) : null,
      el("span", { class: "tab-state", testid: "tab-state", title: stateDetail(view) },
        stateText(view)),
      el("span", { class: "tab-model", testid: "tab-model", title: agent || null },
        agent || "no agent or model reported"), // every tab as tall as the others
    );
  }

  function renderTabs() {
    $nav.replaceChildren(...[...state.sessions.values()].map(renderTab));
  }

  function countPending(view) {
    let count = 0;
    const walk = (blocks) => {
      for (const block of blocks) if (block.kind === "permission" && block.state === "pending") count++;
    };
    walk(view.main.blocks);
    for (const agent of Object.values(view.agents)) walk(agent.blocks);
    return count;
  }

  // -- drawing ------------------------------------------------------------------------

  let scheduled = false;
  function render() {
    if (scheduled) return;
    scheduled = true;
    requestAnimationFrame(() => {
      scheduled = false;
      draw();
    });
  }

  // -- which session is open ------------------------------------------------------------
  // The user's choice once they made one (a tab clicked, a request answered, a run
  // cancelled, or the #session in the address of a reload). Until then the one that
  // needs them (a pending request: the first in the list), else the latest active;
  // then the page follows the work as `busd watch` does: to a session that asks, or
  // one that starts working while the open one is at rest, never away from a request.

  function choose(sessionId) {
    state.selected = sessionId;
    state.pinned = true;
    state.wanted = null;
    history.replaceState(null, "", `#${encodeURIComponent(sessionId)}`);
  }

  function firstChoice() {
    let latest = null;
    for (const view of state.sessions.values()) {
      if (view.state === "waiting") return view.session_id;
      if (!latest || view.last_seq > latest.last_seq) latest = view;
    }
    return latest ? latest.session_id : null;
  }

  function settle(changed) {
    if (state.wanted && state.sessions.has(state.wanted)) choose(state.wanted);
    const current = state.sessions.get(state.selected);
    if (!current) {
      state.pinned = false; // its session is gone (a daemon without its history)
      state.selected = firstChoice();
      return;
    }
    if (state.pinned || current.state === "waiting") return;
    const view = changed && changed !== state.selected ? state.sessions.get(changed) : null;
    if (view && (view.state === "waiting" || (view.busy && !current.busy))) {
      state.selected = changed;
    }
  }

  let shown = null; // the session drawn last: a new one's tab is scrolled into view
  function draw() {
    renderTabs();
    const switched = state.selected !== shown;
    if (switched) {
      shown = state.selected;
      const tab = $nav.querySelector(".tab.active");
      if (tab) tab.scrollIntoView({ block: "nearest" });
    }
    const view = state.sessions.get(state.selected);
    // Newest at the bottom, kept in view unless the reader scrolled up (a new session: its end).
    const stick = switched || $main.scrollHeight - $main.scrollTop - $main.clientHeight < 40;
    $main.replaceChildren(
      view
        ? renderSession(view)
        : el("p", { class: "empty", testid: "empty" }, "No sessions yet: start a run, or ingest one."),
    );
    if (stick) $main.scrollTop = $main.scrollHeight;
  }

  function tick() {
    const now = serverNow();
    for (const node of document.querySelectorAll("[data-started-ts]")) {
      node.textContent = duration(now - Number(node.dataset.startedTs));
    }
  }
  setInterval(tick, 250);

  // -- the server ---------------------------------------------------------------------

  function clock(now) {
    state.offset = now - Date.now() / 1000;
  }

  function connect() {
    const source = new EventSource("/events"); // the cookie goes along: same origin
    const setConnection = (name, text) => {
      $connection.dataset.state = name;
      $connection.textContent = text;
    };
    // "live" is two links: this page to busd web, and busd web to the daemon; and
    // the page holds the stream's snapshot (who it answers as, the sessions), so
    // nothing on it is empty for want of the first frame.
    let daemon = { connected: true, lost: null };
    let synced = false;
    const showDaemon = () => {
      if (!synced) setConnection("syncing", "connected: loading…");
      else if (daemon.connected) setConnection("live", "live");
      else setConnection("daemon-gone", `daemon gone (${daemon.lost}): reconnecting…`);
    };
    source.addEventListener("open", showDaemon);
    source.addEventListener("daemon", (event) => {
      daemon = JSON.parse(event.data);
      showDaemon();
    });
    source.addEventListener("error", () => {
      synced = false; // a new stream starts with a new snapshot
      if (source.readyState === EventSource.CLOSED) {
        setConnection("closed", "disconnected (reload, or open the URL busd web printed)");
      } else {
        setConnection("reconnecting", "reconnecting…");
      }
    });
    source.addEventListener("snapshot", (event) => {
      const data = JSON.parse(event.data);
      clock(data.now);
      daemon = data.daemon;
      state.readOnly = Boolean(data.read_only);
      document.body.dataset.readOnly = String(state.readOnly);
      $name.textContent = state.readOnly ? `read-only: ${data.name}` : `answering as ${data.name}`;
      state.sessions = new Map(data.sessions.map((view) => [view.session_id, view]));
      settle(null);
      render();
      synced = true;
      showDaemon();
    });
    source.addEventListener("session", (event) => {
      const view = JSON.parse(event.data);
      clock(view.now);
      state.sessions.set(view.session_id, view);
      settle(view.session_id);
      render();
    });
    source.addEventListener("status", (event) => {
      const data = JSON.parse(event.data);
      clock(data.now);
      const view = state.sessions.get(data.session_id);
      if (!view) return;
      Object.assign(view, {
        busy: data.busy,
        status_line: data.status_line,
        summary_line: data.summary_line,
      });
      if (data.session_id !== state.selected) return;
      for (const name of ["status_line", "summary_line"]) {
        const line = $main.querySelector(`[data-testid=${name.replace("_", "-")}]`);
        if (line) {
          line.textContent = data[name] || "";
          line.hidden = !data[name];
        }
      }
    });
  }

  async function post(path, key, body) {
    state.posting.add(key);
    state.errors.delete(key);
    render();
    try {
      const response = await fetch(path, {
        method: "POST",
        headers: { "content-type": "application/json" }, // not a simple request: never cross-site
        body: JSON.stringify(body),
      });
      const reply = await response.json().catch(() => ({}));
      if (!response.ok) {
        state.errors.set(key, reply.message || reply.error || `HTTP ${response.status}`);
      }
    } catch (error) {
      state.errors.set(key, `could not reach busd web: ${error}`);
    } finally {
      state.posting.delete(key);
      render();
    }
  }

  // Answering or cancelling is choosing the session: the page stays on it afterwards.
  function postPermission(sessionId, requestId, answer) {
    choose(sessionId);
    return post("/api/permission", requestId, { session_id: sessionId, request_id: requestId, ...answer });
  }

  function postCancel(sessionId, runId) {
    choose(sessionId);
    return post("/api/cancel", runId, { run_id: runId });
  }

  connect();
})();
