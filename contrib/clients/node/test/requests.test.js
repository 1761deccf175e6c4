// The reading requests (everyone's) and request errors. Each result is checked
// against $defs/Result.<cmd> by the client itself (`Result.stats.daemon` for
// `stats` without a session); a result that does not fit rejects the request.

import assert from "node:assert/strict";
import { after, afterEach, before, test } from "node:test";

import { assertNoInvalidFrames, startDaemon } from "../support/daemon.js";

let daemon;
let agent;
let ack;
before(async () => {
  daemon = await startDaemon();
  agent = await daemon.connect({ client: "node-agent", role: "agent" });
  ack = await agent.publish(
    [
      { event: { type: "stream.session.start", title: "Requests", model: "m-1" }, session_id: "rq-1" },
      { event: { type: "stream.text.delta", message_id: "x", text: "hello" }, session_id: "rq-1" },
      { event: { type: "stream.session.start", title: "Other" }, session_id: "rq-2" },
    ],
    { ack: true },
  );
});
after(() => daemon?.stop());
afterEach(() => assertNoInvalidFrames(daemon));

test("status", async () => {
  const bus = await daemon.connect({ client: "node-status", role: "observer" });
  const status = await bus.status();
  assert.equal(status.server, bus.welcome.server);
  assert.equal(status.socket, daemon.socket);
  assert.ok(status.head_seq >= ack.last_seq);
  assert.equal(status.journal, null); // --no-journal
  assert.ok(status.clients >= 2);
  assert.equal(status.clients_by_role.observer, 1);
  assert.equal(status.clients_by_role.agent, 1);
  assert.ok(status.drivers.includes("replay"));
  assert.ok(status.adapters.includes("claude-code"), `adapters: ${status.adapters}`);
  assert.deepEqual(status.roles.agent, ["publish"]);
  assert.deepEqual(status.roles.observer, []);
  await bus.close();
});

test("sessions: most recently active first, with limit", async () => {
  const bus = await daemon.connect({ client: "node-sessions", role: "observer" });
  const sessions = await bus.sessions();
  assert.deepEqual(sessions.map((s) => s.session_id).sort(), ["rq-1", "rq-2"]);
  // most recently active first (busd.stats ticks may make rq-1 the more recent one)
  assert.ok(sessions[0].last_seq >= sessions[1].last_seq);
  const rq1 = sessions.find((s) => s.session_id === "rq-1");
  assert.equal(rq1.title, "Requests");
  assert.equal(rq1.model, "m-1");
  assert.equal(rq1.first_seq, ack.first_seq);
  assert.ok(rq1.events >= 2);
  assert.equal((await bus.sessions(1)).length, 1);
  await bus.close();
});

test("snapshot", async () => {
  const bus = await daemon.connect({ client: "node-snapshot", role: "observer" });
  const snapshot = await bus.snapshot("rq-1");
  assert.equal(snapshot.session_id, "rq-1");
  assert.equal(snapshot.title, "Requests");
  assert.equal(snapshot.first_seq, ack.first_seq);
  assert.ok(snapshot.last_seq >= ack.first_seq + 1);
  assert.equal(snapshot.stats?.type ?? "busd.stats", "busd.stats");
  await bus.close();
});

test("stats: a session's busd.stats; without a session, the daemon's components", async () => {
  const bus = await daemon.connect({ client: "node-stats", role: "observer" });
  const session = await bus.stats("rq-1");
  assert.equal(session.type, "busd.stats");
  assert.equal(typeof session.elapsed_s, "number");
  const whole = await bus.stats();
  for (const component of ["bus", "correlation", "history", "sessions", "fanout"]) {
    assert.equal(typeof whole[component], "object", component);
  }
  assert.equal(whole.fanout.cohorts, 0); // nobody subscribed: no cohort
  assert.ok(whole.history.head_seq >= ack.last_seq);
  await bus.close();
});

test("runs: none started on this daemon", async () => {
  const bus = await daemon.connect({ client: "node-runs", role: "observer" });
  assert.deepEqual(await bus.runs(), []);
  await bus.close();
});

test("request errors: unknown_session, unknown_command, malformed_frame; the connection goes on", async () => {
  const bus = await daemon.connect({ client: "node-errors", role: "observer" });
  await assert.rejects(bus.snapshot("no-such-session"), { name: "BusdError", code: "unknown_session" });
  await assert.rejects(bus.stats("no-such-session"), { code: "unknown_session" });
  await assert.rejects(bus.request({ cmd: "no_such_command" }, { check: false }), { code: "unknown_command" });
  await assert.rejects(bus.request({ cmd: "sessions", limit: "ten" }, { check: false }), {
    code: "malformed_frame",
  });
  // many requests pipelined, answered in order of their ids
  const many = await Promise.all(Array.from({ length: 20 }, () => bus.request({ cmd: "runs" })));
  assert.equal(many.length, 20);
  assert.equal((await bus.close()).reason, "bye");
});

test("the client refuses to send what does not fit $defs/ClientFrame", async () => {
  const bus = await daemon.connect({ client: "node-check", role: "observer" });
  assert.throws(() => bus.send({ op: "subscribe", id: 1, window_ms: 60001 }), TypeError);
  await assert.rejects(bus.request({ cmd: "snapshot" }), TypeError); // session_id is required
  await bus.close();
});
