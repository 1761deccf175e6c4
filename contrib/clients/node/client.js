// A reference busd client: msgpack frames over a Unix socket (docs/protocol.md),
// every frame it receives validated against busd's JSON Schema
// (docs/protocol.schema.json, printed by `busd schema`).
//
//   import { connect } from "./client.js";
//   const bus = await connect({ socket: "/run/user/1000/busd/bus.sock", client: "my-ui" });
//   const sub = bus.subscribe({ patterns: ["stream.text.>"] });
//   for await (const frame of sub) { ... }   // `events` and `gap` frames
//   console.log(await bus.request({ cmd: "status" }));
//   await bus.close();                       // bye -> goodbye
//
// Integers: frames are decoded with `useBigInt64: true`, so a 64-bit integer
// never loses precision. Integers that fit in a JS number exactly
// (|n| <= 2^53 - 1: every seq, id and count busd sends in practice) are turned
// into plain numbers; larger ones stay BigInt. In a field the schema types as
// "integer" a BigInt fails validation (ajv checks `typeof === "number"`), so a
// daemon that ever sends a seq past 2^53 is reported, never silently rounded;
// inside `Any` payloads (tool inputs, raw SDK data) a BigInt is kept as is.
// Outgoing numbers beyond 32 bits are written as msgpack int64/uint64, never
// as floats; BigInt values may be sent too.

import { execFileSync } from "node:child_process";
import { EventEmitter } from "node:events";
import { readFileSync } from "node:fs";
import net from "node:net";

import { Decoder, Encoder } from "@msgpack/msgpack";
import Ajv2020 from "ajv/dist/2020.js";

export const PROTOCOL_VERSION = 1;

/** The largest frame body this client reads unless told otherwise (the server's default cap is 1 MiB). */
export const DEFAULT_MAX_FRAME = 16 * 1024 * 1024;

/** An error the server answered with: an `error` frame or a failed `reply`. */
export class BusdError extends Error {
  /**
   * @param {string} code one of docs/protocol.md "Error codes", e.g. `unknown_session`
   * @param {string} message for people, not for matching
   * @param {object} [frame] the frame that carried it
   */
  constructor(code, message, frame) {
    super(`${code}: ${message}`);
    this.name = "BusdError";
    this.code = code;
    this.frame = frame;
    this.fatal = Boolean(frame?.fatal);
  }
}

/** A frame (or a request's result) that does not fit busd's JSON Schema, or that cannot be decoded. */
export class ValidationError extends Error {
  /**
   * @param {string} message
   * @param {{frame?: unknown, errors?: object[], schema?: string}} [details]
   */
  constructor(message, details = {}) {
    super(message);
    this.name = "ValidationError";
    this.code = "invalid_frame";
    this.frame = details.frame;
    this.errors = details.errors ?? [];
    this.schema = details.schema;
  }
}

/** The connection ended (goodbye, socket closed, fatal error) before an answer came. */
export class ConnectionClosed extends Error {
  /** @param {string} reason @param {object|null} [goodbye] */
  constructor(reason, goodbye = null) {
    super(`connection closed: ${reason}`);
    this.name = "ConnectionClosed";
    this.code = reason;
    this.goodbye = goodbye;
  }
}

// ---------------------------------------------------------------------------
// The schema

/**
 * busd's JSON Schema: from a file, else the output of `$BUSD schema`.
 *
 * `busd` is a command line split on whitespace (default: `$BUSD`, else `busd`).
 * @param {{path?: string, busd?: string}} [options]
 * @returns {object}
 */
export function loadSchema({ path, busd = process.env.BUSD || "busd" } = {}) {
  if (path) return JSON.parse(readFileSync(path, "utf8"));
  const [command, ...args] = busd.trim().split(/\s+/);
  const text = execFileSync(command, [...args, "schema"], { encoding: "utf8", maxBuffer: 64 << 20 });
  return JSON.parse(text);
}

/**
 * Compiled validators over one schema.
 *
 * The schema writes each tagged union as `oneOf` plus an OpenAPI-style
 * `discriminator` (with its `mapping`, which ajv does not take: it is
 * dropped here, the branches' tags say the same). ajv's own `discriminator`
 * support then validates only the branch the tag selects, and its errors
 * name that branch instead of listing every event type. The rewrite changes
 * nothing about what is accepted.
 */
export class Validators {
  /** @param {object} schema busd's JSON Schema (draft 2020-12) */
  constructor(schema) {
    /** The event types the schema knows (its `Event` union's tags). */
    this.eventTypes = new Set(Object.keys(schema.$defs?.Event?.discriminator?.mapping ?? {}));
    this.schema = rewriteDiscriminators(structuredClone(schema));
    this.ajv = new Ajv2020({ strict: true, discriminator: true, allErrors: false });
    this.ajv.addSchema(this.schema, "busd");
    /** @type {Map<string, import("ajv").ValidateFunction>} */
    this.compiled = new Map();
  }

  /** @param {string} name a `$defs` entry, e.g. `ServerFrame`, `Result.status` */
  has(name) {
    return Object.hasOwn(this.schema.$defs, name);
  }

  /**
   * Throw a ValidationError unless `value` fits `$defs/<name>`.
   * @param {string} name
   * @param {unknown} value
   */
  check(name, value) {
    let validate = this.compiled.get(name);
    if (!validate) {
      validate = this.ajv.getSchema(`busd#/$defs/${jsonPointerEscape(name)}`);
      if (!validate) throw new Error(`the schema has no $defs/${name}`);
      this.compiled.set(name, validate);
    }
    if (!validate(value)) {
      const errors = validate.errors ?? [];
      const text = this.ajv.errorsText(errors, { dataVar: "$" });
      throw new ValidationError(`does not fit $defs/${name}: ${text}`, { frame: value, errors, schema: name });
    }
  }
}

function jsonPointerEscape(name) {
  return name.replaceAll("~", "~0").replaceAll("/", "~1");
}

function rewriteDiscriminators(node) {
  if (Array.isArray(node)) {
    node.forEach(rewriteDiscriminators);
  } else if (node && typeof node === "object") {
    if (node.discriminator) {
      if (Array.isArray(node.anyOf) && !node.oneOf) {
        node.oneOf = node.anyOf; // older busd: anyOf (its branches exclude each other)
        delete node.anyOf;
      }
      // ajv takes only `propertyName`; the `mapping` is implied by the branches' tags.
      node.discriminator = { propertyName: node.discriminator.propertyName };
      node.type ??= "object"; // every branch is a map; ajv's strict mode wants it said
    }
    Object.values(node).forEach(rewriteDiscriminators);
  }
  return node;
}

// ---------------------------------------------------------------------------
// Framing

const decoder = new Decoder({ useBigInt64: true });
const encoder = new Encoder({ useBigInt64: true, ignoreUndefined: true });

/** BigInts that fit a JS number become numbers; others stay BigInt (see the top of this file). */
function normalizeIntegers(value) {
  if (typeof value === "bigint") {
    return value >= BigInt(Number.MIN_SAFE_INTEGER) && value <= BigInt(Number.MAX_SAFE_INTEGER)
      ? Number(value)
      : value;
  }
  if (Array.isArray(value)) return value.map(normalizeIntegers);
  if (value && typeof value === "object" && !(value instanceof Uint8Array) && !(value instanceof Date)) {
    const out = {};
    for (const [k, v] of Object.entries(value)) out[k] = normalizeIntegers(v);
    return out;
  }
  return value;
}

/** Integral numbers beyond 32 bits become BigInt, so the encoder writes int64/uint64, not float64. */
function wideIntegers(value) {
  if (typeof value === "number") {
    return Number.isInteger(value) && (value > 0xffffffff || value < -0x80000000) ? BigInt(value) : value;
  }
  if (Array.isArray(value)) return value.map(wideIntegers);
  if (value && typeof value === "object" && !(value instanceof Uint8Array)) {
    const out = {};
    for (const [k, v] of Object.entries(value)) if (v !== undefined) out[k] = wideIntegers(v);
    return out;
  }
  return value;
}

/**
 * One frame with its 4-byte big-endian length prefix.
 * @param {object} frame a map with `op`
 * @returns {Buffer}
 */
export function encodeFrame(frame) {
  const body = encoder.encode(wideIntegers(frame));
  const out = Buffer.allocUnsafe(4 + body.byteLength);
  out.writeUInt32BE(body.byteLength, 0);
  out.set(body, 4);
  return out;
}

/**
 * Decode one frame body (without its prefix): exactly one msgpack value.
 * @param {Uint8Array} body
 */
export function decodeBody(body) {
  return normalizeIntegers(decoder.decode(body)); // throws on trailing bytes
}

/** An incremental reader of length-prefixed frames; the outcome does not depend on chunking. */
export class FrameReader {
  /** @param {number} maxFrame the largest body accepted */
  constructor(maxFrame) {
    this.maxFrame = maxFrame;
    this.chunks = [];
    this.length = 0;
  }

  /** @param {Buffer} chunk */
  feed(chunk) {
    this.chunks.push(chunk);
    this.length += chunk.length;
  }

  /**
   * The next complete body, or null. Throws a fatal BusdError `frame_too_large`
   * as soon as an oversized prefix is read (the stream cannot be resynchronized).
   * @returns {Buffer|null}
   */
  nextBody() {
    if (this.length < 4) return null;
    if (this.chunks.length > 1) this.chunks = [Buffer.concat(this.chunks, this.length)];
    const buf = this.chunks[0];
    const size = buf.readUInt32BE(0);
    if (size > this.maxFrame) {
      throw new BusdError("frame_too_large", `the server sent a ${size}-byte frame; this client reads at most ${this.maxFrame}`, { fatal: true });
    }
    if (this.length < 4 + size) return null;
    const body = buf.subarray(4, 4 + size);
    const rest = buf.subarray(4 + size);
    this.chunks = rest.length ? [rest] : [];
    this.length = rest.length;
    return body;
  }
}

// ---------------------------------------------------------------------------
// The connection

/**
 * @typedef {object} SubscribeOptions
 * @property {number} [id] chosen by the client (default: the next free one)
 * @property {string[]} [patterns] NATS-style type patterns (server default `[">"]`)
 * @property {string[]|null} [sessions] only these sessions (server default: all)
 * @property {boolean} [owned_only] only events of runs this client started
 * @property {number} [window_ms] batching window, 0..60000
 * @property {"merged"|"raw"} [deltas]
 * @property {number|null} [since_seq] replay retained events after this seq first
 */

/**
 * @typedef {object} ConnectOptions
 * @property {string} socket the daemon's Unix socket
 * @property {string} [client] the name in `hello` (default `busd-node/0.1`)
 * @property {"observer"|"frontend"|"responder"|"agent"|"admin"} [role] default: the server's, `frontend`
 * @property {object} [schema] the JSON Schema object (default: {@link loadSchema})
 * @property {string} [schemaPath] read the schema from this file instead
 * @property {Validators} [validators] reuse compiled validators (cheaper for many connections)
 * @property {number} [maxFrame] the largest frame body read (default 16 MiB)
 * @property {number} [timeoutMs] how long to wait for `welcome` (default 10 s)
 * @property {"skip"|"error"} [unknownEvents] an envelope whose event `type` the schema does
 *   not know (a plugin's type: `busd schema` prints the built-in catalog): `skip` it, counted
 *   in `skippedEvents`, as docs/protocol.md asks of clients (default), or fail validation
 */

let sharedValidators = null;

/**
 * Connect, say `hello`, and wait for `welcome`.
 * @param {ConnectOptions} options
 * @returns {Promise<BusdClient>}
 */
export async function connect(options) {
  let validators = options.validators;
  if (!validators) {
    if (options.schema || options.schemaPath) {
      validators = new Validators(options.schema ?? loadSchema({ path: options.schemaPath }));
    } else {
      sharedValidators ??= new Validators(loadSchema());
      validators = sharedValidators;
    }
  }
  const client = new BusdClient(validators, options);
  await client._handshake(options);
  return client;
}

/**
 * One connection to busd. Create it with {@link connect}.
 *
 * Events: `frame` (every valid frame received), `server-error` (an `error`
 * frame not about a live subscription), `invalid` (a ValidationError: a frame
 * that does not fit the schema, or cannot be decoded; it is not dispatched),
 * `goodbye` (the goodbye frame), `close`.
 */
export class BusdClient extends EventEmitter {
  /** @param {Validators} validators @param {ConnectOptions} options */
  constructor(validators, options) {
    super();
    this.validators = validators;
    this.reader = new FrameReader(options.maxFrame ?? DEFAULT_MAX_FRAME);
    /** @type {object|null} the `welcome` frame */
    this.welcome = null;
    /** @type {object|null} the `goodbye` frame, once received */
    this.goodbye = null;
    /** @type {ValidationError[]} every frame that failed validation */
    this.invalidFrames = [];
    /** @type {object[]} envelopes skipped for an event type the schema does not know */
    this.skippedEvents = [];
    this.unknownEvents = options.unknownEvents ?? "skip";
    /** @type {object[]} `error` frames not tied to a live subscription */
    this.serverErrors = [];
    /** @type {Map<number, {resolve: Function, reject: Function, result?: string}>} by request or ack id */
    this.pending = new Map();
    /** @type {Map<number, Subscription>} */
    this.subscriptions = new Map();
    /** @type {Map<number, Function[]>} pong waiters by nonce */
    this.pings = new Map();
    this.nextId = 1;
    this.nextNonce = 1;
    this.closedReason = null;
    this.socket = null;
    /** Resolves (never rejects) when the socket is closed, with the goodbye frame or null. */
    this.closed = new Promise((resolve) => this.once("close", () => resolve(this.goodbye)));
  }

  /** How the daemon labels this connection (`source` of its events, `by` of its decisions). */
  get identity() {
    return this.welcome?.identity ?? "";
  }

  /** What this connection's role may change beyond reading. */
  get rights() {
    return this.welcome?.rights ?? [];
  }

  /** The server's limits for this connection. */
  get limits() {
    return this.welcome?.limits;
  }

  /** The resume point of the last `goodbye` (subscribe with `since_seq` = this to miss nothing). */
  get resumeSeq() {
    return this.goodbye?.resume_seq ?? null;
  }

  async _handshake({ socket: path, client = "busd-node/0.1", role, timeoutMs = 10_000 }) {
    const socket = net.createConnection({ path });
    this.socket = socket;
    const welcomed = new Promise((resolve, reject) => {
      this._handshakeDone = { resolve, reject };
    });
    welcomed.catch(() => {}); // awaited below, unless connecting fails first
    socket.on("data", (chunk) => this._onData(chunk));
    socket.on("error", (err) => this._fail(new ConnectionClosed(err.code ?? err.message)));
    socket.on("close", () => this._onClose());
    await new Promise((resolve, reject) => {
      socket.once("connect", resolve);
      socket.once("error", reject);
    });
    this.send({ op: "hello", protocol: PROTOCOL_VERSION, client, role });
    let timer;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new ConnectionClosed("no welcome in time")), timeoutMs);
    });
    try {
      this.welcome = await Promise.race([welcomed, timeout]);
    } catch (err) {
      socket.destroy();
      throw err;
    } finally {
      clearTimeout(timer);
    }
    this._handshakeDone = null;
    return this.welcome;
  }

  /**
   * Send one client frame. It is checked against `$defs/ClientFrame` first
   * (a TypeError if it does not fit, nothing sent) unless `check` is false.
   * @param {object} frame
   * @param {{check?: boolean}} [options]
   */
  send(frame, { check = true } = {}) {
    if (this.closedReason) throw new ConnectionClosed(this.closedReason, this.goodbye);
    const clean = dropUndefined(frame);
    if (check) {
      try {
        this.validators.check("ClientFrame", clean);
      } catch (err) {
        throw new TypeError(`not a valid client frame: ${err.message}`);
      }
    }
    this.socket.write(encodeFrame(clean));
  }

  /**
   * Subscribe. Batches go to `onBatch(frame)` if given, else are queued for the
   * returned subscription's async iterator. Both see `events` frames and `gap`
   * frames (`frame.op` tells them apart). A `subscribe` is answered only by
   * events, or by an `error` with `ref` = its id (`invalid_pattern`, ...),
   * which ends the subscription: the iterator throws it.
   * @param {SubscribeOptions} [options]
   * @param {(frame: object) => void} [onBatch]
   * @returns {Subscription}
   */
  subscribe(options = {}, onBatch) {
    const id = options.id ?? this._freeSubscriptionId();
    const { id: _ignored, ...fields } = options;
    const sub = new Subscription(this, id, onBatch);
    this.subscriptions.get(id)?._end(null); // a subscribe with a live id replaces it
    this.subscriptions.set(id, sub);
    this.send({ op: "subscribe", id, ...fields });
    return sub;
  }

  /** @param {number} id */
  unsubscribe(id) {
    this.send({ op: "unsubscribe", id });
    this.subscriptions.get(id)?._end(null);
    this.subscriptions.delete(id);
  }

  /**
   * Publish events (`Outgoing` maps: `{event, session_id?, run_id?, agent_id?}`).
   * The role must be `agent` or `admin`. Frames over the server's `max_frame`
   * are split; `ack` goes on the last one.
   *
   * With `ack` (an id, or `true` for the next free one) it resolves to the
   * reply's result, `{first_seq, last_seq, journaled}`, or rejects with a
   * BusdError (`forbidden`, `invalid_event`, `not_journaled`, ...). Without it,
   * it resolves at once: a refusal then arrives as an `error` frame
   * (`server-error` event, `serverErrors`).
   * @param {object[]} events
   * @param {{ack?: number|boolean}} [options]
   * @returns {Promise<{first_seq: number, last_seq: number, journaled: boolean}|undefined>}
   */
  async publish(events, { ack } = {}) {
    const ackId = ack === true ? this.nextId++ : ack ?? undefined;
    for (const frame of this._split({ op: "publish", events }, ackId)) this.send(frame);
    // The reply cannot come before this: frames are read in a later turn of the event loop.
    return ackId === undefined ? undefined : this._expectReply(ackId, { ack: true });
  }

  /**
   * Raw SDK payloads for the daemon's adapter `sdk` to translate (role `agent`
   * or `admin`); `ack` as on {@link publish}. Frames over `max_frame` are split.
   * @param {string} sdk an adapter name (`status().adapters`)
   * @param {unknown[]} events the SDK's own messages, in stream order
   * @param {{session_id?: string, end?: boolean, ack?: number|boolean}} [options]
   */
  async ingest(sdk, events, { session_id, end, ack } = {}) {
    const ackId = ack === true ? this.nextId++ : ack ?? undefined;
    const frames = this._split({ op: "ingest", sdk, events, session_id }, ackId);
    if (end) frames.at(-1).end = true; // only the last frame ends the stream
    for (const frame of frames) this.send(frame);
    return ackId === undefined ? undefined : this._expectReply(ackId, { ack: true });
  }

  /** `frame` (a publish or ingest) as frames whose bodies fit `max_frame`; `ack` on the last. */
  _split(frame, ack) {
    const max = this.limits?.max_frame ?? 1048576;
    const whole = dropUndefined({ ...frame, ack });
    if (frame.events.length <= 1 || encodeFrame(whole).length - 4 <= max) return [whole];
    const half = Math.ceil(frame.events.length / 2);
    return [
      ...this._split({ ...frame, events: frame.events.slice(0, half) }, undefined),
      ...this._split({ ...frame, events: frame.events.slice(half) }, ack),
    ];
  }

  /**
   * Send a request and wait for its reply. Resolves to the `result`, checked
   * against `$defs/Result.<cmd>` (`Result.stats.daemon` for `stats` without a
   * session); rejects with a BusdError whose `.code` is the reply's error code.
   * @param {{cmd: string, [field: string]: unknown}} command
   * @param {{check?: boolean}} [options] `check: false` sends a command the schema does not know
   */
  async request(command, { check = true } = {}) {
    const id = this.nextId++;
    let result = `Result.${command.cmd}`;
    if (command.cmd === "stats" && command.session_id == null) result = "Result.stats.daemon";
    this.send({ op: "request", id, command }, { check }); // throws before anything is awaited
    return this._expectReply(id, { result });
  }

  /** @returns {Promise<object>} */
  status() {
    return this.request({ cmd: "status" });
  }

  /** @param {number} [limit] @returns {Promise<object[]>} */
  sessions(limit) {
    return this.request({ cmd: "sessions", limit });
  }

  /** @param {string} session_id */
  snapshot(session_id) {
    return this.request({ cmd: "snapshot", session_id });
  }

  /** @param {string} [session_id] without it: the whole daemon's statistics */
  stats(session_id) {
    return this.request({ cmd: "stats", session_id });
  }

  /** @returns {Promise<object[]>} */
  runs() {
    return this.request({ cmd: "runs" });
  }

  /**
   * @param {{adapter: string, prompt: string, driver?: string, session_id?: string, model?: string,
   *   system_prompt?: string, cwd?: string, permission_mode?: string, max_turns?: number, options?: object}} run
   * @returns {Promise<{run_id: string, session_id: string}>}
   */
  startRun(run) {
    return this.request({ cmd: "start_run", ...run });
  }

  /** @param {string} run_id @param {string} [reason] */
  cancelRun(run_id, reason) {
    return this.request({ cmd: "cancel_run", run_id, reason });
  }

  /** @param {{request_id: string, option_id?: string, allow?: boolean, reason?: string}} reply */
  permissionReply(reply) {
    return this.request({ cmd: "permission_reply", ...reply });
  }

  /**
   * Ping; resolves to the `pong` frame. A `pong` may overtake events of a
   * `publish` sent before the `ping`: it says nothing about delivery.
   * @param {number} [nonce]
   */
  async ping(nonce = this.nextNonce++) {
    this.send({ op: "ping", nonce });
    return new Promise((resolve, reject) => {
      const waiters = this.pings.get(nonce) ?? [];
      waiters.push({ resolve, reject });
      this.pings.set(nonce, waiters);
    });
  }

  /**
   * Say `bye`, wait for `goodbye` and the socket's end. Resolves to the
   * goodbye frame (its `resume_seq` is where to resume), or null when the
   * connection was already gone without one.
   */
  async close() {
    if (!this.closedReason) {
      this.send({ op: "bye" });
    }
    return this.closed;
  }

  /** Drop the socket without a `bye`. */
  destroy() {
    this.socket?.destroy();
    return this.closed;
  }

  // -- receiving -------------------------------------------------------------

  _freeSubscriptionId() {
    let id = 1;
    while (this.subscriptions.has(id)) id++;
    return id;
  }

  _expectReply(id, how) {
    if (this.pending.has(id)) throw new Error(`id ${id} is already in flight`);
    return new Promise((resolve, reject) => this.pending.set(id, { resolve, reject, ...how }));
  }

  _onData(chunk) {
    this.reader.feed(chunk);
    for (;;) {
      let body;
      try {
        body = this.reader.nextBody();
      } catch (err) {
        this._fail(err); // an oversized prefix: the stream is lost
        this.socket.destroy();
        return;
      }
      if (body === null) return;
      let frame;
      try {
        frame = decodeBody(body);
      } catch (err) {
        this._invalid(new ValidationError(`a frame body that is not one msgpack value: ${err.message}`));
        continue; // the prefix was fine: go on with the next frame
      }
      if (this.unknownEvents === "skip" && frame?.op === "events" && Array.isArray(frame.events)) {
        const known = this.validators.eventTypes;
        const unknown = (e) => typeof e?.event?.type === "string" && !known.has(e.event.type);
        if (frame.events.some(unknown)) {
          this.skippedEvents.push(...frame.events.filter(unknown));
          frame = { ...frame, events: frame.events.filter((e) => !unknown(e)) };
          if (!frame.events.length) continue;
        }
      }
      try {
        this.validators.check("ServerFrame", frame);
      } catch (err) {
        this._invalid(err);
        continue;
      }
      this._dispatch(frame);
    }
  }

  /** A frame that failed validation is not dispatched; whoever waits for it hears of it. */
  _invalid(err) {
    this.invalidFrames.push(err);
    const frame = err.frame;
    if (frame && typeof frame === "object") {
      if (frame.op === "reply" && this.pending.has(frame.id)) {
        this.pending.get(frame.id).reject(err);
        this.pending.delete(frame.id);
      } else if ((frame.op === "events" || frame.op === "gap") && this.subscriptions.has(frame.sub)) {
        this.subscriptions.get(frame.sub)._error(err);
      } else if (frame.op === "welcome" && this._handshakeDone) {
        this._handshakeDone.reject(err);
      }
    }
    this.emit("invalid", err);
  }

  _dispatch(frame) {
    this.emit("frame", frame);
    switch (frame.op) {
      case "welcome":
        if (this._handshakeDone) this._handshakeDone.resolve(frame);
        break;
      case "events":
      case "gap":
        this.subscriptions.get(frame.sub)?._push(frame);
        break;
      case "reply":
        this._onReply(frame);
        break;
      case "pong": {
        const waiters = this.pings.get(frame.nonce ?? 0);
        const waiter = waiters?.shift();
        if (waiters && !waiters.length) this.pings.delete(frame.nonce ?? 0);
        waiter?.resolve(frame);
        break;
      }
      case "error":
        this._onError(frame);
        break;
      case "goodbye":
        this.goodbye = frame;
        this.closedReason = frame.reason;
        this.emit("goodbye", frame);
        break;
    }
  }

  _onReply(frame) {
    const waiter = this.pending.get(frame.id);
    if (!waiter) return;
    this.pending.delete(frame.id);
    if (!frame.ok) {
      const info = frame.error ?? { code: "unknown", message: "a failed reply without an error" };
      waiter.reject(new BusdError(info.code, info.message, frame));
      return;
    }
    if (waiter.result && this.validators.has(waiter.result)) {
      try {
        this.validators.check(waiter.result, frame.result);
      } catch (err) {
        this.invalidFrames.push(err);
        this.emit("invalid", err);
        waiter.reject(err);
        return;
      }
    }
    waiter.resolve(frame.result);
  }

  _onError(frame) {
    const err = new BusdError(frame.code, frame.message, frame);
    if (this._handshakeDone) {
      this._handshakeDone.reject(err); // its goodbye follows
      return;
    }
    const sub = frame.ref != null && !frame.fatal ? this.subscriptions.get(frame.ref) : undefined;
    // Subscription errors that end the subscription; `seq_ahead` and a
    // non-fatal `frame_too_large` are warnings: events go on.
    if (sub && ["invalid_pattern", "too_many_subscriptions", "unknown_subscription"].includes(frame.code)) {
      this.subscriptions.delete(frame.ref);
      sub._error(err);
      return;
    }
    if (sub) sub.warnings.push(err);
    this.serverErrors.push(frame);
    this.emit("server-error", err);
  }

  _fail(err) {
    if (!this.closedReason) this.closedReason = err.code ?? "error";
    this._failure ??= err;
  }

  _onClose() {
    const reason = this.goodbye?.reason ?? this.closedReason ?? "closed";
    this.closedReason = reason;
    const err = this._failure ?? new ConnectionClosed(reason, this.goodbye);
    this._handshakeDone?.reject(err);
    for (const waiter of this.pending.values()) waiter.reject(err);
    this.pending.clear();
    for (const waiters of this.pings.values()) for (const w of waiters) w.reject(err);
    this.pings.clear();
    for (const sub of this.subscriptions.values()) sub._end(this.goodbye ? null : this._failure ?? null);
    this.emit("close", this.goodbye);
  }
}

/**
 * One subscription: an async iterator of its `events` and `gap` frames
 * (unless it was given an `onBatch` callback). It ends when the subscription
 * is unsubscribed or the connection says goodbye, and throws a BusdError if
 * the server refused it (or a ValidationError for a frame that does not fit).
 */
export class Subscription {
  /** @param {BusdClient} client @param {number} id @param {(frame: object) => void} [onBatch] */
  constructor(client, id, onBatch) {
    this.client = client;
    this.id = id;
    this.onBatch = onBatch;
    /** The highest `seq` received: subscribe again with `since_seq` = this after a disconnect. */
    this.lastSeq = null;
    /** @type {object[]} `gap` frames received */
    this.gaps = [];
    /** @type {BusdError[]} non-fatal errors about it that did not end it (`seq_ahead`, `frame_too_large`) */
    this.warnings = [];
    this.queue = [];
    this.waiters = [];
    this.done = false;
    this.failure = null;
  }

  _push(frame) {
    if (this.done) return;
    if (frame.op === "events") {
      for (const envelope of frame.events) this.lastSeq = Math.max(this.lastSeq ?? 0, envelope.seq);
    } else {
      this.gaps.push(frame);
    }
    if (this.onBatch) {
      this.onBatch(frame);
      return;
    }
    const waiter = this.waiters.shift();
    if (waiter) waiter.resolve({ value: frame, done: false });
    else this.queue.push(frame);
  }

  _error(err) {
    if (this.done) return;
    this.failure = err;
    this._end(err);
  }

  _end(err) {
    if (this.done) return;
    this.done = true;
    if (err) this.failure = err;
    for (const waiter of this.waiters.splice(0)) {
      if (this.failure) waiter.reject(this.failure);
      else waiter.resolve({ value: undefined, done: true });
    }
  }

  /** @returns {Promise<IteratorResult<object>>} */
  next() {
    if (this.queue.length) return Promise.resolve({ value: this.queue.shift(), done: false });
    if (this.failure) return Promise.reject(this.failure);
    if (this.done) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  /** Leaving a `for await` loop unsubscribes. */
  async return() {
    if (!this.done && !this.client.closedReason) this.client.unsubscribe(this.id);
    this._end(null);
    return { value: undefined, done: true };
  }

  [Symbol.asyncIterator]() {
    return this;
  }

  /**
   * Envelopes one by one (gaps are recorded in `gaps`), until `until(envelope)`
   * is true for one (it is included) or `timeoutMs` passes (then it throws).
   * @param {(envelope: object) => boolean} until
   * @param {{timeoutMs?: number}} [options]
   * @returns {Promise<object[]>}
   */
  async collect(until, { timeoutMs = 10_000 } = {}) {
    const got = [];
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      let timer;
      const timeout = new Promise((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`subscription ${this.id}: timed out after ${got.length} events`)),
          Math.max(0, deadline - Date.now()),
        );
      });
      let step;
      try {
        step = await Promise.race([this.next(), timeout]);
      } finally {
        clearTimeout(timer);
      }
      if (step.done) return got;
      if (step.value.op !== "events") continue;
      for (const envelope of step.value.events) {
        got.push(envelope);
        if (until(envelope)) return got;
      }
    }
  }
}

/** A copy without `undefined` values (absent means the default), in nested maps too. */
function dropUndefined(value) {
  if (Array.isArray(value)) return value.map(dropUndefined);
  if (value && typeof value === "object" && Object.getPrototypeOf(value) === Object.prototype) {
    const out = {};
    for (const [k, v] of Object.entries(value)) if (v !== undefined) out[k] = dropUndefined(v);
    return out;
  }
  return value;
}
