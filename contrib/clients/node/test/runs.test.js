// Driven runs with the built-in replay driver (docs/runs.md, "Replaying a
// recording"): start_run, a permission reply, cancel_run, runs, owned_only.

import assert from "node:assert/strict";
import { after, afterEach, before, test } from "node:test";

import { assertNoInvalidFrames, startDaemon } from "../support/daemon.js";

let daemon;
before(async () => {
  daemon = await startDaemon();
});
after(() => daemon?.stop());
afterEach(() => assertNoInvalidFrames(daemon));

/** The bundled Claude Code recording: thinking, a Write permission request, two model calls. */
const replay = (speed) => ({
  adapter: "claude-code",
  driver: "replay",
  prompt: "Create tmp/hello-allow.txt containing hello",
  options: { recording: "claude_code", speed },
});

const isType = (type) => (e) => e.event.type === type;

test("start_run (replay), a permission reply, the run to the end; owned_only is per client", async () => {
  const frontend = await daemon.connect({ client: "node-frontend" });
  const other = await daemon.connect({ client: "node-other" });
  const mine = frontend.subscribe({ owned_only: true, window_ms: 0, deltas: "raw" });
  const notMine = other.subscribe({ owned_only: true, window_ms: 0 });
  await frontend.ping();
  await other.ping();

  const run = await frontend.startRun(replay(0));
  assert.match(run.run_id, /\S/);
  assert.match(run.session_id, /\S/);

  const untilAsked = await mine.collect(isType("stream.permission.requested"));
  assert.deepEqual(untilAsked[0].event.type, "busd.run.started");
  assert.equal(untilAsked[0].event.adapter, "claude-code");
  assert.equal(untilAsked[0].event.prompt, replay(0).prompt);
  for (const e of untilAsked) {
    assert.equal(e.run_id, run.run_id);
    assert.equal(e.session_id, run.session_id);
  }
  const asked = untilAsked.at(-1).event;
  assert.equal(asked.tool, "Write");
  const allowOnce = asked.options.find((o) => o.kind === "allow_once");
  assert.ok(allowOnce, `options: ${JSON.stringify(asked.options)}`);

  const snapshot = await frontend.snapshot(run.session_id);
  assert.equal(snapshot.pending_permissions, 1);
  assert.deepEqual(snapshot.permissions.map((p) => p.event.request_id), [asked.request_id]);

  await assert.rejects(
    frontend.permissionReply({ request_id: asked.request_id, option_id: "no-such-option" }),
    { code: "invalid_option" },
  );
  const decision = await frontend.permissionReply({ request_id: asked.request_id, option_id: allowOnce.id });
  assert.deepEqual(decision, { outcome: "allowed", option_id: allowOnce.id, by: frontend.identity });

  const rest = await mine.collect(isType("busd.run.finished"));
  const resolved = rest.find(isType("stream.permission.resolved"));
  assert.equal(resolved.event.by, frontend.identity);
  assert.equal(resolved.event.outcome, "allowed");
  const finished = rest.at(-1).event;
  assert.equal(finished.status, "ok");
  assert.equal(finished.usage.output_tokens, 231); // the recording's totals (busd/data/recordings/README.md)
  assert.deepEqual(finished.tools.map((t) => t.name), ["Write"]);
  // seq order throughout
  const seqs = [...untilAsked, ...rest].map((e) => e.seq);
  seqs.slice(1).forEach((s, i) => assert.ok(s > seqs[i]));

  // a later reply, once the resolution is out, is refused
  await assert.rejects(
    other.permissionReply({ request_id: asked.request_id, allow: false }),
    { code: "already_resolved" },
  );
  await assert.rejects(frontend.permissionReply({ request_id: "run-x/nope", allow: true }), {
    code: "unknown_request",
  });

  // owned_only: the other frontend started nothing, so it saw none of this run
  await other.ping();
  assert.equal(notMine.queue.length, 0, JSON.stringify(notMine.queue.slice(0, 2)));

  const runs = await other.runs();
  assert.deepEqual(runs.find((r) => r.run_id === run.run_id), {
    run_id: run.run_id,
    session_id: run.session_id,
    adapter: "claude-code",
    driver: "replay",
    status: "ok",
    started_by: frontend.identity,
  });
  await assert.rejects(frontend.cancelRun(run.run_id), { code: "run_finished" });

  await frontend.close();
  await other.close();
});

test("cancel_run stops a replay; busd.run.cancelled says who", async () => {
  const frontend = await daemon.connect({ client: "node-canceller" });
  const sub = frontend.subscribe({ owned_only: true, window_ms: 0 });
  await frontend.ping();
  const run = await frontend.startRun(replay(1)); // 8 s at speed 1: still running when cancelled
  await sub.collect(isType("busd.run.started"));
  const summary = await frontend.cancelRun(run.run_id, "enough");
  // As of the answer: the run ends on the bus (docs: cancel_run's summary still says running).
  assert.equal(summary.run_id, run.run_id);
  assert.equal(summary.status, "running");
  assert.equal(summary.started_by, frontend.identity);
  const rest = await sub.collect(isType("busd.run.finished"));
  const cancelled = rest.find(isType("busd.run.cancelled"));
  assert.deepEqual(cancelled.event, { type: "busd.run.cancelled", by: frontend.identity, reason: "enough" });
  assert.equal(rest.at(-1).event.status, "cancelled");
  assert.equal((await frontend.runs()).find((r) => r.run_id === run.run_id).status, "cancelled");
  await frontend.close();
});

test("a pending permission request is resolved cancelled when its run is cancelled", async () => {
  const frontend = await daemon.connect({ client: "node-canceller" });
  const sub = frontend.subscribe({ owned_only: true, window_ms: 0 });
  await frontend.ping();
  const run = await frontend.startRun(replay(0));
  const asked = (await sub.collect(isType("stream.permission.requested"))).at(-1).event;
  await frontend.cancelRun(run.run_id);
  const rest = await sub.collect(isType("busd.run.finished"));
  const resolved = rest.find(isType("stream.permission.resolved"));
  assert.equal(resolved.event.request_id, asked.request_id);
  assert.equal(resolved.event.outcome, "cancelled");
  assert.equal(rest.at(-1).event.status, "cancelled");
  await frontend.close();
});

test("run errors: unknown_adapter, unknown_driver, unknown_run, forbidden for an observer", async () => {
  const frontend = await daemon.connect({ client: "node-run-errors" });
  await assert.rejects(frontend.startRun({ ...replay(0), adapter: "no-such-adapter" }), { code: "unknown_adapter" });
  await assert.rejects(frontend.startRun({ ...replay(0), driver: "no-such-driver" }), { code: "unknown_driver" });
  await assert.rejects(frontend.cancelRun("run-nope"), { code: "unknown_run" });
  const observer = await daemon.connect({ client: "node-observer", role: "observer" });
  await assert.rejects(observer.startRun(replay(0)), { code: "forbidden" });
  await assert.rejects(observer.cancelRun("run-nope"), { code: "forbidden" });
  await frontend.close();
  await observer.close();
});

test(
  "a second permission_reply pipelined right after the winning one gets already_resolved",
  async () => {
    const frontend = await daemon.connect({ client: "node-race" });
    const sub = frontend.subscribe({ owned_only: true, window_ms: 0 });
    await frontend.ping();
    await frontend.startRun(replay(0));
    const asked = (await sub.collect(isType("stream.permission.requested"))).at(-1).event;
    const [first, second] = await Promise.allSettled([
      frontend.permissionReply({ request_id: asked.request_id, option_id: "allow" }),
      frontend.permissionReply({ request_id: asked.request_id, option_id: "deny" }),
    ]);
    await sub.collect(isType("busd.run.finished"));
    await frontend.close();
    assert.equal(first.value?.outcome, "allowed");
    assert.equal(second.reason?.code, "already_resolved", `second reply: ${JSON.stringify(second.value)}`);
  },
);
