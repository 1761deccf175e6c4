// Subscriptions, publishing, resuming from a seq, and gaps.

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { after, afterEach, before, test } from "node:test";

import { BusdError } from "../client.js";
import { assertNoInvalidFrames, nextServerError, startDaemon } from "../support/daemon.js";

let daemon;
before(async () => {
  daemon = await startDaemon();
});
after(() => daemon?.stop());
afterEach(() => assertNoInvalidFrames(daemon));

const text = (session_id, message_id, t) => ({
  event: { type: "stream.text.delta", message_id, text: t },
  session_id,
});

test("publish with ack; subscribers get the events in seq order, filtered by patterns and sessions", async () => {
  const agent = await daemon.connect({ client: "node-agent", role: "agent" });
  const watcher = await daemon.connect({ client: "node-watcher" });
  // "stream.>": the published events, not the busd.* ones the daemon derives from them
  // (busd.stats comes every 250 ms while a session is busy).
  const all = watcher.subscribe({ patterns: ["stream.>"], sessions: ["ev-a", "ev-b"], window_ms: 0, deltas: "raw" });
  const onlyB = watcher.subscribe({ patterns: ["stream.*.delta"], sessions: ["ev-b"], window_ms: 0, deltas: "raw" });
  const starts = watcher.subscribe({ patterns: ["stream.session.>"], window_ms: 0 });
  await watcher.ping(); // the subscribes are in effect once the pong is back

  const events = [
    { event: { type: "stream.session.start", title: "A" }, session_id: "ev-a" },
    { event: { type: "stream.session.start", title: "B" }, session_id: "ev-b" },
    text("ev-a", "m1", "one"),
    text("ev-b", "m2", "two"),
    { event: { type: "stream.text.complete", message_id: "m2", text: "two" }, session_id: "ev-b" },
    text("ev-a", "m1", "three"),
    text("ev-b", "m2", "four"),
  ];
  const ack = await agent.publish(events, { ack: true });
  assert.equal(ack.journaled, false); // --no-journal: accepted and delivered, in memory only
  assert.ok(ack.last_seq - ack.first_seq + 1 >= events.length);

  // Wait for the last event by its content: ack.last_seq may be the seq of an
  // event the daemon derived (busd.stats), which these patterns leave out.
  const got = await all.collect((e) => e.event.text === "four");
  assert.equal(got[0].seq, ack.first_seq);
  assert.ok(got.at(-1).seq <= ack.last_seq);
  got.slice(1).forEach((e, i) => assert.ok(e.seq > got[i].seq, "strictly increasing seqs"));
  assert.deepEqual(got.map((e) => e.event), events.map((e) => e.event));
  for (const e of got) {
    assert.equal(e.source, agent.identity); // set by the daemon, not by a payload field
    assert.equal(typeof e.ts, "number");
    assert.match(e.id, /^[0-9a-f-]{36}$/);
  }

  const b = await onlyB.collect((e) => e.event.text === "four");
  assert.deepEqual(b.map((e) => e.event.text), ["two", "four"]);
  assert.ok(b.every((e) => e.session_id === "ev-b"));

  const s = await starts.collect((e) => e.event.title === "B");
  assert.deepEqual(s.map((e) => e.event.type), ["stream.session.start", "stream.session.start"]);

  await agent.close();
  await watcher.close();
});

test("merged deltas arrive concatenated, carrying the later seq", async () => {
  const agent = await daemon.connect({ client: "node-agent", role: "agent" });
  const watcher = await daemon.connect({ client: "node-merged" });
  const merged = watcher.subscribe({ patterns: ["stream.text.delta"], sessions: ["ev-m"], window_ms: 200 });
  await watcher.ping();
  const ack = await agent.publish(
    ["a", "b", "c", "d"].map((t) => text("ev-m", "mm", t)),
    { ack: true },
  );
  const got = await merged.collect((e) => e.event.text.endsWith("d"));
  assert.equal(got.map((e) => e.event.text).join(""), "abcd"); // lossless
  assert.ok(got.length < 4, `expected some merging, got ${got.length} deltas`);
  await agent.close();
  await watcher.close();
});

test("resume: after goodbye, since_seq replays exactly what came after", async () => {
  const agent = await daemon.connect({ client: "node-agent", role: "agent" });
  const first = await daemon.connect({ client: "node-resume" });
  const sub = first.subscribe({ patterns: ["stream.>"], sessions: ["ev-r"], window_ms: 0, deltas: "raw" });
  await first.ping();
  const before = await agent.publish([1, 2, 3].map((n) => text("ev-r", "r", `before-${n}`)), { ack: true });
  await sub.collect((e) => e.event.text === "before-3");
  const goodbye = await first.close();
  assert.equal(goodbye.reason, "bye");
  assert.ok(goodbye.resume_seq >= sub.lastSeq);
  for await (const _ of sub) assert.fail("the subscription ends with the connection");

  // Published while nobody listens to ev-r.
  const during = await agent.publish([1, 2, 3, 4].map((n) => text("ev-r", "r", `during-${n}`)), { ack: true });

  const second = await daemon.connect({ client: "node-resume" });
  const resumed = second.subscribe({
    patterns: ["stream.>"],
    sessions: ["ev-r"],
    window_ms: 0,
    deltas: "raw",
    since_seq: sub.lastSeq,
  });
  const live = await agent.publish([text("ev-r", "r", "live")], { ack: true });
  const got = await resumed.collect((e) => e.event.text === "live");
  assert.deepEqual(got.map((e) => e.event.text), ["during-1", "during-2", "during-3", "during-4", "live"]);
  assert.ok(got[0].seq > sub.lastSeq && got.at(-2).seq <= during.last_seq && got.at(-1).seq <= live.last_seq);
  assert.deepEqual(resumed.gaps, []);
  // strictly increasing seqs across replay and live: no duplicates, no hole in between
  got.slice(1).forEach((e, i) => assert.ok(e.seq > got[i].seq));
  await second.close();
  await agent.close();
});

test("a frontend may not publish: forbidden, as an error frame, or a failed reply with ack", async () => {
  const frontend = await daemon.connect({ client: "node-frontend" });
  assert.ok(!frontend.rights.includes("publish"));
  const error = nextServerError(frontend);
  await frontend.publish([text("ev-f", "f", "nope")]);
  const err = await error;
  assert.equal(err.code, "forbidden");
  assert.equal(err.fatal, false);
  await assert.rejects(frontend.publish([text("ev-f", "f", "nope")], { ack: true }), { code: "forbidden" });
  assert.equal((await frontend.ping()).op, "pong"); // non-fatal: the connection goes on
  await frontend.close();
});

test("a refused busd.* event: an invalid_event error frame, then the ack's reply, ok", async () => {
  // docs/protocol.md, "Acknowledged publishes": the reply is about durability, not
  // acceptance; an event refused after decoding gets its error frame (no ref) first.
  const agent = await daemon.connect({ client: "node-agent", role: "agent" });
  const seen = [];
  agent.on("frame", (f) => seen.push(f.op));
  const error = nextServerError(agent);
  const ack = await agent.publish([{ event: { type: "busd.run.cancelled" }, session_id: "ev-x" }], { ack: true });
  const err = await error;
  assert.ok(err instanceof BusdError);
  assert.equal(err.code, "invalid_event");
  assert.equal(err.frame.ref ?? null, null);
  assert.deepEqual(seen, ["error", "reply"]);
  assert.equal(typeof ack.journaled, "boolean");
  await agent.close();
});

test("an ack answers for every event the connection published so far: first_seq stays the first one's", async () => {
  const agent = await daemon.connect({ client: "node-agent", role: "agent" });
  const one = await agent.publish([text("ev-ack", "a", "1"), text("ev-ack", "a", "2")], { ack: true });
  const two = await agent.publish([text("ev-ack", "a", "3")], { ack: true });
  const none = await agent.publish([], { ack: true });
  assert.equal(two.first_seq, one.first_seq);
  assert.ok(two.last_seq > one.last_seq);
  assert.deepEqual(none, two);
  await agent.close();
});

test("a bad pattern ends the subscription with invalid_pattern; unsubscribe of an unknown id", async () => {
  const bus = await daemon.connect({ client: "node-patterns" });
  const bad = bus.subscribe({ patterns: ["stream.te*"] });
  await assert.rejects(bad.next(), { code: "invalid_pattern" });
  const error = nextServerError(bus);
  bus.send({ op: "unsubscribe", id: 4242 });
  const err = await error;
  assert.equal(err.code, "unknown_subscription");
  assert.equal(err.frame.ref, 4242);
  await bus.close();
});

const RECORDING = new URL("../../../../busd/data/recordings/claude_code.jsonl", import.meta.url);

test("ingest: raw SDK payloads translated by the daemon's adapter", { skip: !existsSync(RECORDING) && "no busd checkout" }, async () => {
  // The raw Claude Code stream-json lines of the bundled recording (docs/runs.md).
  const raw = readFileSync(RECORDING, "utf8")
    .split("\n")
    .slice(1)
    .filter((line) => line.trim())
    .map((line) => JSON.parse(line).raw);
  const agent = await daemon.connect({ client: "node-ingest", role: "agent" });
  const watcher = await daemon.connect({ client: "node-ingest-watcher" });
  const sub = watcher.subscribe({ patterns: ["stream.>"], window_ms: 0, deltas: "raw" });
  await watcher.ping();
  const ack = await agent.ingest("claude-code", raw, { end: true, ack: true });
  const got = await sub.collect((e) => e.event.type === "stream.session.idle");
  assert.equal(got[0].seq, ack.first_seq);
  assert.ok(got.at(-1).seq <= ack.last_seq);
  assert.ok(got.every((e) => e.source === `${agent.identity}/claude-code`));
  const types = new Set(got.map((e) => e.event.type));
  for (const type of ["stream.session.start", "stream.text.delta", "stream.permission.requested", "stream.tool.complete"]) {
    assert.ok(types.has(type), `${type} in ${[...types]}`);
  }
  // A permission request of a stream busd only observes is answered by that SDK's host, not through busd.
  const asked = got.find((e) => e.event.type === "stream.permission.requested").event;
  await assert.rejects(watcher.permissionReply({ request_id: asked.request_id, allow: true }), {
    code: "unknown_request",
  });
  await agent.close();

  // An unknown SDK: an error frame (no ref), then the ack's reply, ok; a connection that
  // has published nothing gets first_seq and last_seq null.
  const fresh = await daemon.connect({ client: "node-ingest", role: "agent" });
  const error = nextServerError(fresh);
  const reply = await fresh.ingest("no-such-sdk", [{}], { ack: true });
  assert.equal((await error).code, "unknown_sdk");
  assert.deepEqual(reply, { first_seq: null, last_seq: null, journaled: false });
  await fresh.close();
  await watcher.close();
});
