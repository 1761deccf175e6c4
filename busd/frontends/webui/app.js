// busd web: draws the session snapshots busd sends over Server-Sent Events.
// Every figure (status line, summary, context) comes computed from the server,
// the same model `busd watch` renders; only the live timers of thinking and
// tool blocks tick here, from their start time and the server's clock.
// Access is the session cookie busd web set when the printed URL was opened
// (HttpOnly: this script never sees it); answers are JSON POSTs, which the
// server takes from this origin only.
"use strict";

(() => {
  const state = {
    readOnly: false, // busd web --read-only: show, never answer nor cancel
    sessions: new Map(), // session_id -> snapshot
    selected: null,
    pinned: false, // the user chose a tab: stop following the latest activity
    offset: 0, // server clock minus ours, in seconds
    open: new Set(), // keys of expanded <details>
    posting: new Set(), // request ids and run ids with a POST in flight
    errors: new Map(), // request id or run id -> message of the last failed POST
  };

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

  function inputSummary(input) {
    if (!input || typeof input !== "object") return "";
    for (const key of ["command", "file_path", "path", "pattern", "url", "query", "description"]) {
      if (typeof input[key] === "string") return input[key];
    }
    const text = JSON.stringify(input);
    return text === "{}" ? "" : text;
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
          ? el("span", {}, `Thought for ${duration(block.duration_s)}`)
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

  const TOOL_MARK = { running: "…", ok: "✓", error: "✗", cancelled: "⊘" };

  function renderTool(view, block) {
    const key = `${view.session_id}:tool:${block.tool_call_id}`;
    const time =
      block.duration_s === null || block.duration_s === undefined
        ? timer(block.started_ts)
        : el("span", { class: "timer" }, duration(block.duration_s));
    const head = el(
      "span",
      { class: "tool-head" },
      el("span", { class: "mark" }, TOOL_MARK[block.status] || "?"),
      el("span", { class: "tool-name", testid: "tool-name" }, block.name),
      el("span", { class: "tool-input" }, inputSummary(block.input)),
      el("span", { class: "tool-status", testid: "tool-status" }, block.status),
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
      el("div", { class: "permission-input" }, inputSummary(block.input)),
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

  function renderContext(view) {
    const ctx = view.context;
    if (!ctx) return null;
    const parts = ctx.breakdown || {};
    const known = (parts.system || 0) + (parts.tools || 0) + (parts.messages || 0);
    const segments = [
      ["system", parts.system || 0],
      ["tools", parts.tools || 0],
      ["messages", parts.messages || 0],
      ["other", Math.max(0, ctx.used - known)], // used but not broken down
      ["free", parts.free ?? (ctx.window ? Math.max(0, ctx.window - ctx.used) : 0)],
    ];
    const total = ctx.window || segments.reduce((sum, [, value]) => sum + value, 0) || 1;
    const bar = el("div", {
      class: "context-bar" + (ctx.window ? "" : " no-window"),
      title: ctx.window ? null : "window size unknown: the bar shows what the context holds",
      testid: "context-bar",
      role: "img",
      "aria-label": view.context_line || "",
      data: { used: String(ctx.used), window: String(ctx.window ?? "") },
    });
    for (const [name, value] of segments) {
      if (!value) continue;
      const segment = el("div", {
        class: `segment ${name}`,
        testid: `context-${name}`,
        title: `${name}: ${value.toLocaleString()} tokens`,
        data: { tokens: String(value) },
      });
      segment.style.width = `${Math.min(100, (value / total) * 100)}%`;
      bar.append(segment);
    }
    return el(
      "div",
      { class: "context", testid: "context" },
      bar,
      el("div", { class: "context-line", testid: "context-line" }, view.context_line || ""),
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
        el("h2", { testid: "session-title" }, view.title || view.session_id),
        el(
          "div",
          { class: "meta" },
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
                  onclick: () => postCancel(view.run_id),
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
    );
  }

  function renderTabs() {
    $nav.replaceChildren(
      ...[...state.sessions.values()].map((view) => {
        const pending = countPending(view);
        return el(
          "button",
          {
            type: "button",
            class: "tab" + (view.session_id === state.selected ? " active" : ""),
            testid: "session-tab",
            data: { sessionId: view.session_id, busy: String(view.busy) },
            onclick: () => {
              state.selected = view.session_id;
              state.pinned = true;
              render();
            },
          },
          el("span", { class: "tab-title" }, view.title || view.session_id),
          el("span", { class: "tab-meta" }, [view.adapter, view.model].filter(Boolean).join(" · ")),
          view.busy ? el("span", { class: "busy-dot", title: "busy" }) : null,
          pending ? el("span", { class: "badge", testid: "pending-count" }, String(pending)) : null,
        );
      }),
    );
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

  function draw() {
    if (!state.pinned || !state.sessions.has(state.selected)) {
      let latest = null;
      for (const view of state.sessions.values()) {
        if (!latest || view.last_seq > latest.last_seq) latest = view;
      }
      state.selected = latest ? latest.session_id : null;
    }
    renderTabs();
    const view = state.sessions.get(state.selected);
    const stick = $main.scrollHeight - $main.scrollTop - $main.clientHeight < 40;
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
    // "live" is two links: this page to busd web, and busd web to the daemon.
    let daemon = { connected: true, lost: null };
    const showDaemon = () => {
      if (daemon.connected) setConnection("live", "live");
      else setConnection("daemon-gone", `daemon gone (${daemon.lost}): reconnecting…`);
    };
    source.addEventListener("open", showDaemon);
    source.addEventListener("daemon", (event) => {
      daemon = JSON.parse(event.data);
      showDaemon();
    });
    source.addEventListener("error", () => {
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
      showDaemon();
      state.readOnly = Boolean(data.read_only);
      document.body.dataset.readOnly = String(state.readOnly);
      $name.textContent = state.readOnly ? `read-only: ${data.name}` : `answering as ${data.name}`;
      state.sessions = new Map(data.sessions.map((view) => [view.session_id, view]));
      render();
    });
    source.addEventListener("session", (event) => {
      const view = JSON.parse(event.data);
      clock(view.now);
      state.sessions.set(view.session_id, view);
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

  function postPermission(sessionId, requestId, answer) {
    return post("/api/permission", requestId, { session_id: sessionId, request_id: requestId, ...answer });
  }

  function postCancel(runId) {
    return post("/api/cancel", runId, { run_id: runId });
  }

  connect();
})();
