// What the client does with frames that do not fit the schema, against a fake
// server on a Unix socket that sends scripted frames (the schema is still the
// real one, from `$BUSD schema`).

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { FrameReader, ValidationError, connect, decodeBody, encodeFrame } from "../client.js";
import { schemaValidators } from "../support/daemon.js";

const WELCOME = {
  op: "welcome",
  server: "fake",
  protocol: 1,
  client_id: 1,
  head_seq: 0,
  limits: {
    max_frame: 1048576,
    max_subscriptions: 64,
    max_inflight_requests: 16,
    outbound_cap: 8388608,
    window_ms_default: 16,
    replay_capacity: 100000,
  },
  identity: "fake[pid=1,uid=1]",
};

const envelope = (seq, event = { type: "stream.text.delta", message_id: "m", text: "t" }) => ({
  seq,
  ts: 1700000000.25,
  event,
  session_id: "s",
});

let dir;
let validators;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), "busd-node-fake-"));
  validators = await schemaValidators();
});
after(() => rmSync(dir, { recursive: true, force: true }));

/**
 * A fake busd: answers `hello` with `welcome` (or `onHello`'s buffers), then calls
 * `onFrame(frame, write)` for every later client frame.
 */
async function fakeServer(name, { onHello = () => [encodeFrame(WELCOME)], onFrame = () => {} } = {}) {
  const path = join(dir, `${name}.sock`);
  const server = net.createServer((socket) => {
    const reader = new FrameReader(1 << 20);
    let greeted = false;
    socket.on("data", (chunk) => {
      reader.feed(chunk);
      for (let body; (body = reader.nextBody()); ) {
        const frame = decodeBody(body);
        if (!greeted) {
          greeted = true;
          for (const buf of onHello(frame)) socket.write(buf);
        } else if (frame.op === "bye") {
          socket.end(encodeFrame({ op: "goodbye", reason: "bye", resume_seq: 0 }));
        } else {
          onFrame(frame, (buf) => socket.write(buf));
        }
      }
    });
    socket.on("error", () => {});
  });
  await new Promise((resolve) => server.listen(path, resolve));
  return { path, close: () => new Promise((resolve) => server.close(resolve)) };
}

test("no daemon at the socket: connect rejects with the system's error code", async () => {
  await assert.rejects(connect({ socket: join(dir, "nobody.sock"), validators }), { code: "ENOENT" });
});

test("a welcome that does not fit the schema fails the connect", async () => {
  const { limits: _dropped, ...noLimits } = WELCOME;
  const fake = await fakeServer("welcome", { onHello: () => [encodeFrame(noLimits)] });
  try {
    await assert.rejects(connect({ socket: fake.path, validators }), (err) => {
      assert.ok(err instanceof ValidationError);
      assert.match(err.message, /limits/);
      return true;
    });
  } finally {
    await fake.close();
  }
});

test("an events frame that does not fit: the subscription throws it; the connection goes on", async () => {
  const fake = await fakeServer("events", {
    onFrame(frame, write) {
      if (frame.op === "subscribe") {
        write(encodeFrame({ op: "events", sub: frame.id, events: [envelope(1)] }));
        write(encodeFrame({ op: "events", sub: frame.id, events: [envelope("two")] }));
      }
      if (frame.op === "ping") write(encodeFrame({ op: "pong", nonce: frame.nonce }));
    },
  });
  try {
    const bus = await connect({ socket: fake.path, validators });
    const sub = bus.subscribe({});
    assert.equal((await sub.next()).value.events[0].seq, 1);
    await assert.rejects(sub.next(), (err) => {
      assert.ok(err instanceof ValidationError);
      assert.equal(err.schema, "ServerFrame");
      assert.match(err.message, /seq/);
      return true;
    });
    assert.equal(bus.invalidFrames.length, 1);
    assert.equal((await bus.ping()).op, "pong");
    await bus.close();
  } finally {
    await fake.close();
  }
});

test("an unknown event type is skipped (counted), or with unknownEvents: error, fails validation", async () => {
  const fake = await fakeServer("unknown-type", {
    onFrame(frame, write) {
      if (frame.op === "subscribe") {
        write(encodeFrame({ op: "events", sub: frame.id, events: [envelope(1, { type: "plugin.thing" }), envelope(2)] }));
      }
    },
  });
  try {
    const skipping = await connect({ socket: fake.path, validators });
    const frame = (await skipping.subscribe({}).next()).value;
    assert.deepEqual(frame.events.map((e) => e.seq), [2]);
    assert.deepEqual(skipping.skippedEvents.map((e) => e.event.type), ["plugin.thing"]);
    assert.deepEqual(skipping.invalidFrames, []);
    await skipping.close();

    const strict = await connect({ socket: fake.path, validators, unknownEvents: "error" });
    await assert.rejects(strict.subscribe({}).next(), /value of tag "type" must be in oneOf/);
    await strict.close();
  } finally {
    await fake.close();
  }
});

test("a result that does not fit $defs/Result.<cmd> rejects the request", async () => {
  const fake = await fakeServer("result", {
    onFrame(frame, write) {
      if (frame.op === "request") {
        const result = frame.command.cmd === "start_run" ? { run_id: "r" } : { server: "fake" };
        write(encodeFrame({ op: "reply", id: frame.id, ok: true, result }));
      }
    },
  });
  try {
    const bus = await connect({ socket: fake.path, validators });
    await assert.rejects(bus.status(), { name: "ValidationError", schema: "Result.status" });
    await assert.rejects(bus.startRun({ adapter: "a", prompt: "p" }), {
      name: "ValidationError",
      schema: "Result.start_run",
    });
    assert.equal(bus.invalidFrames.length, 2);
    await bus.close();
  } finally {
    await fake.close();
  }
});

test("integers: 64-bit values stay exact (BigInt); an integer field past 2^53 fails validation", async () => {
  const big = 2n ** 60n + 1n;
  const fake = await fakeServer("bigint", {
    onFrame(frame, write) {
      if (frame.op === "subscribe") {
        const tool = { type: "stream.tool.start", tool_call_id: "t", name: "Big", input: { n: big } };
        write(encodeFrame({ op: "events", sub: frame.id, events: [envelope(2 ** 40, tool)] }));
        write(encodeFrame({ op: "events", sub: frame.id, events: [envelope(2n ** 53n + 1n)] }));
      }
    },
  });
  try {
    const bus = await connect({ socket: fake.path, validators });
    const sub = bus.subscribe({});
    const first = (await sub.next()).value.events[0];
    assert.equal(first.seq, 2 ** 40); // a uint64 on the wire, a safe number here
    assert.equal(first.event.input.n, big); // inside `Any`: kept exact, as a BigInt
    await assert.rejects(sub.next(), (err) => err instanceof ValidationError && /seq/.test(err.message));
    await bus.close();
  } finally {
    await fake.close();
  }
});

test("a body that is not one msgpack value is dropped; an oversized prefix ends the connection", async () => {
  const fake = await fakeServer("bytes", {
    onFrame(frame, write) {
      if (frame.op !== "ping") return;
      const good = encodeFrame({ op: "pong", nonce: frame.nonce });
      const trailing = Buffer.concat([good, Buffer.from([0xc0])]); // one byte too many in the body
      trailing.writeUInt32BE(good.length - 4 + 1, 0);
      write(trailing);
      write(good);
      if (frame.nonce === 2) write(Buffer.from([0x7f, 0xff, 0xff, 0xff])); // 2 GiB announced
    },
  });
  try {
    const bus = await connect({ socket: fake.path, validators, maxFrame: 1 << 20 });
    assert.equal((await bus.ping(1)).nonce, 1);
    assert.equal(bus.invalidFrames.length, 1);
    assert.match(bus.invalidFrames[0].message, /msgpack/);
    const pong = bus.ping(2);
    assert.equal((await pong).nonce, 2);
    await bus.closed;
    assert.equal(bus.closedReason, "frame_too_large");
    await assert.rejects(bus.ping(3), { name: "ConnectionClosed" });
  } finally {
    await fake.close();
  }
});
