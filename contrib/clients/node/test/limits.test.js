// A daemon with small limits: a replay ring of 3 events (so resuming from 0 has a
// gap), a 4 KiB max_frame (so the client splits its publish frames, and an event
// published right at the cap cannot be delivered) and 3 subscriptions per connection.

import assert from "node:assert/strict";
import { after, afterEach, before, test } from "node:test";

import { encodeFrame } from "../client.js";
import { assertNoInvalidFrames, nextServerError, startDaemon } from "../support/daemon.js";

let daemon;
before(async () => {
  daemon = await startDaemon(["--replay", "3", "--max-frame", "4096", "--max-subscriptions", "3"]);
});
after(() => daemon?.stop());
afterEach(() => assertNoInvalidFrames(daemon));

const text = (session_id, message_id, t) => ({
  event: { type: "stream.text.delta", message_id, text: t },
  session_id,
});

test("gap: events evicted from the replay ring (no journal) are reported first, then the rest replays", async () => {
  const agent = await daemon.connect({ client: "node-agent", role: "agent" });
  const ack = await agent.publish(
    Array.from({ length: 8 }, (_, i) => text("gap", "g", `${i}`)),
    { ack: true },
  );
  const bus = await daemon.connect({ client: "node-gap" });
  const sub = bus.subscribe({ patterns: ["stream.text.delta"], since_seq: 0, window_ms: 0, deltas: "raw" });
  const replayed = await sub.collect((e) => e.event.text === "7");
  // One gap, first, for what the ring (3 events) no longer holds; the daemon's own
  // busd.* events take seqs too, so the ring may hold fewer of the agent's.
  assert.equal(sub.gaps.length, 1);
  const [gap] = sub.gaps;
  assert.deepEqual(gap, { op: "gap", sub: sub.id, from_seq: 1, to_seq: gap.to_seq });
  assert.ok(gap.to_seq >= ack.last_seq - 3, `gap ${JSON.stringify(gap)}`);
  // what the ring still holds of the agent's events is replayed, in order, up to the last one
  assert.ok(replayed.length >= 1 && replayed.length <= 3);
  assert.ok(replayed[0].seq > gap.to_seq);
  assert.deepEqual(
    replayed.map((e) => e.event.text),
    ["5", "6", "7"].slice(3 - replayed.length),
  );
  replayed.slice(1).forEach((e, i) => assert.equal(e.seq, replayed[i].seq + 1));
  await bus.close();
  await agent.close();
});

test("publish frames over the server's max_frame are split; the ack covers them all", async () => {
  const agent = await daemon.connect({ client: "node-agent", role: "agent" });
  assert.equal(agent.limits.max_frame, 4096);
  const watcher = await daemon.connect({ client: "node-split" });
  const sub = watcher.subscribe({ patterns: ["stream.text.delta"], sessions: ["split"], window_ms: 0, deltas: "raw" });
  await watcher.ping();
  const sent = [];
  const write = agent.socket.write.bind(agent.socket);
  agent.socket.write = (buf, ...rest) => {
    sent.push(buf.length - 4);
    return write(buf, ...rest);
  };
  const events = Array.from({ length: 20 }, (_, i) => text("split", "s", `${i}:${"x".repeat(500)}`));
  const ack = await agent.publish(events, { ack: true });
  assert.ok(sent.length > 1, `one frame of ${sent[0]} bytes`);
  assert.ok(sent.every((n) => n <= 4096), `frame sizes ${sent}`);
  const got = await sub.collect((e) => e.event.text.startsWith("19:"));
  assert.ok(got.at(-1).seq <= ack.last_seq);
  assert.deepEqual(got.map((e) => e.event.text), events.map((e) => e.event.text));
  await agent.close();
  await watcher.close();
});

test("an event published right at max_frame: a non-fatal frame_too_large for the subscription, which goes on", async () => {
  const agent = await daemon.connect({ client: "node-agent", role: "agent" });
  const watcher = await daemon.connect({ client: "node-too-large" });
  const sub = watcher.subscribe({ patterns: ["stream.text.delta"], sessions: ["large"], window_ms: 0 });
  await watcher.ping();
  let n = 4096;
  while (encodeFrame({ op: "publish", events: [text("large", "l", "x".repeat(n))], ack: 1 }).length - 4 > 4096) n--;
  const error = nextServerError(watcher);
  await agent.publish([text("large", "l", "x".repeat(n))], { ack: true }); // accepted: it fits a publish
  const err = await error;
  assert.equal(err.code, "frame_too_large");
  assert.equal(err.fatal, false);
  assert.equal(err.frame.ref, sub.id);
  assert.deepEqual(sub.warnings, [err]);
  await agent.publish([text("large", "l", "small")], { ack: true });
  const got = await sub.collect((e) => e.event.text === "small");
  assert.deepEqual(got.map((e) => e.event.text), ["small"]);
  await agent.close();
  await watcher.close();
});

test("one subscription over max_subscriptions: too_many_subscriptions, and no subscription made", async () => {
  const bus = await daemon.connect({ client: "node-many" });
  const subs = [1, 2, 3].map(() => bus.subscribe({ patterns: ["stream.session.start"] }));
  const fourth = bus.subscribe({ patterns: ["stream.session.start"] });
  await assert.rejects(fourth.next(), { code: "too_many_subscriptions" });
  assert.deepEqual(subs.map((s) => s.id), [1, 2, 3]);
  // a subscribe with a live id replaces that subscription: allowed at the limit
  bus.subscribe({ id: 2, patterns: ["stream.session.>"] });
  assert.equal((await bus.ping()).op, "pong");
  assert.deepEqual(bus.serverErrors, []);
  await bus.close();
});
