// Test helpers: a real `busd serve` as a child process, and clients that are
// checked for invalid frames after every test.

import { execFile, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";

import { Validators, connect } from "../client.js";

/** The busd command line, split on whitespace: `$BUSD`, else `busd` on the PATH. */
export const BUSD = process.env.BUSD || "busd";

let validators = null;

/**
 * Compiled once per test process from the output of `$BUSD schema` (what
 * `loadSchema()` in client.js does, but without blocking, so that it runs
 * while the daemon starts).
 * @returns {Promise<Validators>}
 */
export function schemaValidators() {
  validators ??= (async () => {
    const [command, ...prefix] = BUSD.trim().split(/\s+/);
    const { stdout } = await promisify(execFile)(command, [...prefix, "schema"], { maxBuffer: 64 << 20 });
    return new Validators(JSON.parse(stdout));
  })();
  return validators;
}

/**
 * Start `busd serve --socket <tmp>/bus.sock --no-journal [...args]` and wait
 * until it accepts connections.
 * @param {string[]} [args] more `busd serve` flags
 * @returns {Promise<{socket: string, connect: Function, stop: () => Promise<void>, output: () => string}>}
 */
export async function startDaemon(args = []) {
  const compiled = schemaValidators(); // in parallel with the daemon's start
  const dir = mkdtempSync(join(tmpdir(), "busd-node-"));
  const socket = join(dir, "bus.sock");
  const [command, ...prefix] = BUSD.trim().split(/\s+/);
  const child = spawn(command, [...prefix, "serve", "--socket", socket, "--no-journal", ...args], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  child.stdout.on("data", (d) => (output += d));
  child.stderr.on("data", (d) => (output += d));
  const exited = new Promise((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
  let gone = false;
  exited.then(() => (gone = true));

  const deadline = Date.now() + 15_000;
  for (;;) {
    if (gone) throw new Error(`busd serve exited before listening:\n${output}`);
    if (await canConnect(socket)) break;
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`busd serve did not listen on ${socket} within 15 s:\n${output}`);
    }
    await sleep(50);
  }

  const clients = [];
  const validators = await compiled;
  return {
    validators,
    socket,
    output: () => output,
    clients,
    /** Connect a client to this daemon (name and role as given); it is remembered for {@link assertNoInvalidFrames}. */
    async connect(options = {}) {
      const bus = await connect({ socket, validators, ...options });
      clients.push(bus);
      return bus;
    },
    async stop() {
      await Promise.all(clients.map((c) => c.destroy()));
      if (!gone) {
        child.kill("SIGTERM");
        const timer = setTimeout(() => child.kill("SIGKILL"), 5_000);
        await exited;
        clearTimeout(timer);
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

function canConnect(path) {
  return new Promise((resolve) => {
    const s = net.createConnection({ path });
    s.once("connect", () => {
      s.destroy();
      resolve(true);
    });
    s.once("error", () => resolve(false));
  });
}

/**
 * Fail if any client of `daemon` received a frame (or result) that does not fit
 * the schema, or an event whose type the schema does not know.
 */
export function assertNoInvalidFrames(daemon) {
  const invalid = daemon.clients.flatMap((c) => c.invalidFrames);
  if (invalid.length) {
    throw new Error(`${invalid.length} frame(s) failed validation:\n${invalid.map((e) => e.message).join("\n")}`);
  }
  const skipped = daemon.clients.flatMap((c) => c.skippedEvents);
  if (skipped.length) {
    throw new Error(`event types the schema does not know: ${[...new Set(skipped.map((e) => e.event.type))]}`);
  }
}

/** Wait until `predicate()` holds, polling (for counters the daemon updates asynchronously). */
export async function eventually(predicate, { timeoutMs = 5_000, what = "condition" } = {}) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await predicate();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

/** Resolve with the next `server-error` of `bus` (a BusdError), or reject after `timeoutMs`. */
export function nextServerError(bus, timeoutMs = 5_000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("no error frame in time")), timeoutMs);
    bus.once("server-error", (err) => {
      clearTimeout(timer);
      resolve(err);
    });
  });
}
