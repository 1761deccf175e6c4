import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import net from "node:net";
import { after, afterEach, before, test } from "node:test";

import { BusdError, FrameReader, decodeBody, encodeFrame } from "../client.js";
import { assertNoInvalidFrames, startDaemon } from "../support/daemon.js";

let daemon;
before(async () => {
  daemon = await startDaemon();
});
after(() => daemon?.stop());
afterEach(() => assertNoInvalidFrames(daemon));

test("welcome: server, protocol, identity, rights and limits", async () => {
  const bus = await daemon.connect({ client: "node-handshake" });
  const w = bus.welcome;
  assert.equal(w.op, "welcome");
  assert.equal(w.protocol, 1);
  assert.equal(typeof w.server, "string");
  assert.ok(Number.isInteger(w.client_id) && w.client_id > 0);
  assert.ok(Number.isInteger(w.head_seq) && w.head_seq >= 0);
  // identity is the daemon's label from SO_PEERCRED: <client>[pid=<pid>,uid=<uid>]
  assert.equal(bus.identity, `node-handshake[pid=${process.pid},uid=${process.getuid()}]`);
  // the default role is frontend: it may start and cancel runs and answer permissions, not publish
  assert.deepEqual([...bus.rights].sort(), ["cancel_run", "permission_reply", "start_run"]);
  assert.deepEqual(w.limits, {
    max_frame: 1048576,
    max_subscriptions: 64,
    max_inflight_requests: 16,
    outbound_cap: 8388608,
    window_ms_default: 16,
    replay_capacity: 100000,
  });
  assert.deepEqual(await bus.close(), { op: "goodbye", reason: "bye", resume_seq: w.head_seq });
});

test("rights follow the role", async () => {
  const rights = {};
  for (const role of ["observer", "frontend", "responder", "agent", "admin"]) {
    const bus = await daemon.connect({ client: `node-${role}`, role });
    rights[role] = [...bus.rights].sort();
    await bus.close();
  }
  assert.deepEqual(rights, {
    observer: [],
    frontend: ["cancel_run", "permission_reply", "start_run"],
    responder: ["permission_reply"],
    agent: ["publish"],
    admin: ["cancel_run", "permission_reply", "publish", "start_run"],
  });
});

test("a reserved client name is refused with a fatal forbidden", async () => {
  await assert.rejects(daemon.connect({ client: "busd" }), (err) => {
    assert.ok(err instanceof BusdError);
    assert.equal(err.code, "forbidden");
    assert.equal(err.fatal, true);
    return true;
  });
});

test("ping answers pong with the nonce; a second hello is a non-fatal bad_handshake", async () => {
  const bus = await daemon.connect({ client: "node-ping" });
  assert.deepEqual(await bus.ping(7), { op: "pong", nonce: 7 });
  const error = new Promise((resolve) => bus.once("server-error", resolve));
  bus.send({ op: "hello", protocol: 1, client: "again" });
  const err = await error;
  assert.equal(err.code, "bad_handshake");
  assert.equal(err.fatal, false);
  assert.equal((await bus.ping()).op, "pong"); // the connection goes on
  assert.equal((await bus.close()).reason, "bye");
});

test("version_mismatch, byte by byte: a fatal error, then its goodbye", async () => {
  // Below the client library: raw frames on a socket, each checked against $defs/ServerFrame.
  const frames = await new Promise((resolve, reject) => {
    const socket = net.createConnection({ path: daemon.socket });
    const reader = new FrameReader(1 << 20);
    const got = [];
    socket.on("connect", () => socket.write(encodeFrame({ op: "hello", protocol: 99, client: "node-raw" })));
    socket.on("data", (chunk) => {
      reader.feed(chunk);
      for (let body; (body = reader.nextBody()); ) got.push(decodeBody(body));
    });
    socket.on("close", () => resolve(got));
    socket.on("error", reject);
  });
  for (const frame of frames) daemon.validators.check("ServerFrame", frame);
  assert.deepEqual(
    frames.map((f) => [f.op, f.code ?? f.reason, f.fatal]),
    [
      ["error", "version_mismatch", true],
      ["goodbye", "version_mismatch", undefined],
    ],
  );
});

const PROTOCOL_MD = new URL("../../../../docs/protocol.md", import.meta.url);

test("the byte-level examples of docs/protocol.md: decoded, valid, and re-encoded byte for byte", { skip: !existsSync(PROTOCOL_MD) && "no busd checkout" }, () => {
  const dumps = [...readFileSync(PROTOCOL_MD, "utf8").matchAll(/```\n((?:[0-9a-f]{2}(?: [0-9a-f]{2})*\n)+)```/g)].map(
    (m) => Buffer.from(m[1].replace(/\s/g, ""), "hex"),
  );
  assert.equal(dumps.length, 3, "a hello, a welcome and an events frame");
  const frames = dumps.map((bytes) => {
    assert.equal(bytes.readUInt32BE(0), bytes.length - 4, "the length prefix counts the body");
    const frame = decodeBody(bytes.subarray(4));
    daemon.validators.check(frame.op === "hello" ? "ClientFrame" : "ServerFrame", frame);
    assert.deepEqual(encodeFrame(frame), bytes);
    return frame;
  });
  assert.deepEqual(frames[0], { op: "hello", protocol: 1, client: "tui" });
  assert.equal(frames[1].head_seq, 41);
  assert.deepEqual(frames[2].events[0].event, { type: "stream.text.delta", message_id: "m1", text: "Hi" });
  assert.equal(frames[2].events[0].ts, 1700000000.25);
});
