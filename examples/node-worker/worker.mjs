#!/usr/bin/env node
// A cronwheel worker in plain Node.js (20 or later): the HTTP worker protocol of
// docs/worker-protocol.md, with the built-in fetch and nothing else.
//
//   CRONWHEEL_URL=http://127.0.0.1:8000 CRONWHEEL_API_KEY=<worker key> node worker.mjs
//
// It registers, long-polls for runs of the tasks below, heartbeats everything it holds
// in one request, runs each handler with a deadline, ships its log lines, completes or
// fails each attempt with its fencing token, and on SIGTERM / SIGINT stops leasing,
// lets running handlers finish within a grace period, hands back the rest and
// deregisters.

import { hostname } from "node:os";

// -- the handlers: one per task name -------------------------------------------------

// A handler gets `ctx` and the run's payload; what it returns is the run's result.
// A thrown error fails the attempt (retried under the job's retry policy); a
// NonRetryableError fails the run at once. `ctx.signal` aborts on a cancel, a lost
// lease, the deadline or shutdown: long work should watch it.
export class NonRetryableError extends Error {
  name = "NonRetryableError";
}

const handlers = {
  "node.greet": async (ctx, payload) => {
    const greeting = `hello, ${payload.name ?? "world"}`;
    ctx.log("INFO", `${greeting} (run ${ctx.runId}, attempt ${ctx.attempt})`);
    // Downstream writes carry ctx.fencingToken and ctx.idempotencyKey, so the system
    // written to can refuse a stale writer or a duplicate.
    return { greeting };
  },
  "node.divide": async (ctx, payload) => {
    if (payload.by === 0) throw new NonRetryableError("division by zero");
    const quotient = payload.n / payload.by;
    if (!Number.isFinite(quotient)) throw new Error(`cannot divide ${payload.n} by ${payload.by}`);
    return { quotient };
  },
  "node.sleep": async (ctx, payload) => {
    for (let done = 0; done < (payload.seconds ?? 1); done++) {
      await sleep(1000, ctx.signal); // throws when ctx.signal aborts
      ctx.progress({ seconds: done + 1 }); // rides on the next heartbeat
    }
    return { slept: payload.seconds ?? 1 };
  },
};

// -- configuration: environment variables ---------------------------------------------

const env = process.env;
const config = {
  url: (env.CRONWHEEL_URL ?? "http://127.0.0.1:8000").replace(/\/+$/, ""),
  key: env.CRONWHEEL_API_KEY,
  pool: env.CRONWHEEL_POOL || "default",
  // The tasks this worker runs: a subset of the handlers above (all by default).
  tasks: env.CRONWHEEL_TASKS ? env.CRONWHEEL_TASKS.split(",").map((t) => t.trim()) : Object.keys(handlers),
  // Send `tasks` at registration, so the server hands out only runs of those tasks.
  declareTasks: env.CRONWHEEL_DECLARE_TASKS !== "0",
  capacity: Number(env.CRONWHEEL_CAPACITY || 4),
  gracePeriod: Number(env.CRONWHEEL_GRACE_PERIOD || 10), // seconds
  name: env.CRONWHEEL_WORKER_NAME || `node-${hostname()}-${process.pid}`,
};

// -- HTTP ------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message, retryAfter) {
    super(`${status} ${code}: ${message}`);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
  }
}

async function call(method, path, body, { timeout = 10, signal } = {}) {
  const signals = [AbortSignal.timeout(timeout * 1000), ...(signal ? [signal] : [])];
  const response = await fetch(config.url + path, {
    method,
    headers: { Authorization: `Bearer ${config.key}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.any(signals),
  });
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (!response.ok) {
    const error = data?.error ?? {};
    const retryAfter = Number(response.headers.get("retry-after")) || undefined;
    throw new ApiError(response.status, error.code ?? "http_error", error.message ?? text, retryAfter);
  }
  return data;
}

// 401 and 403 will not get better; 404, 409, 410, 413 and 422 are answers, not failures.
const isAnswer = (err) => err instanceof ApiError && err.status < 500 && err.status !== 429;

// A call repeated on network errors, 5xx and 429 until it gets an answer (`tries` at
// most). Every call of the protocol may be repeated: the fencing token makes it safe.
async function persist(send, tries = 10) {
  for (let n = 1; ; n++) {
    try {
      return await send();
    } catch (err) {
      if (isAnswer(err) || n >= tries) throw err;
      await sleep(1000 * (err.retryAfter ?? Math.min(2 ** n / 4, 10)));
    }
  }
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const aborted = () => (clearTimeout(timer), reject(signal.reason));
    const timer = setTimeout(() => (signal?.removeEventListener("abort", aborted), resolve()), ms);
    signal?.addEventListener("abort", aborted, { once: true });
  });
}

const say = (message) => console.log(`[worker] ${message}`);

// -- the worker --------------------------------------------------------------------------

const held = new Map(); // attempt id -> what the worker knows of an attempt it holds
const stop = new AbortController(); // aborts the lease long-poll at shutdown
let worker; // the registration answer
let slotFreed = () => {}; // wakes the lease loop waiting for a free slot
let p0Reserved = 0; // this worker's slots only P0 runs may take, as the last lease said
let leased = () => {}; // wakes the heartbeat loop: a new attempt may need beats sooner

async function register() {
  const body = { pool: config.pool, capacity: config.capacity, name: config.name };
  if (config.declareTasks) body.tasks = config.tasks;
  worker = await persist(() => call("POST", "/v1/workers", body));
  say(`registered worker ${worker.worker_id} (pool ${config.pool}; tasks: ${config.tasks.join(", ")})`);
}

async function leaseLoop() {
  while (!stop.signal.aborted) {
    const free = config.capacity - held.size;
    if (free <= 0) {
      await new Promise((resolve) => (slotFreed = resolve));
      continue;
    }
    // With only the slots the pool keeps for P0 free, a long-poll could only bring a P0
    // run and would still be waiting when another slot frees: ask without waiting.
    const p0Only = free <= p0Reserved;
    const wait = p0Only ? 0 : Math.min(20, worker.lease_wait_max);
    try {
      const path = `/v1/workers/${worker.worker_id}/lease`;
      const options = { timeout: wait + 15, signal: stop.signal }; // the read outlasts the wait
      const answer = await call("POST", path, { max: free, wait }, options);
      p0Reserved = answer.p0_reserved_slots ?? 0;
      for (const lease of answer.attempts) begin(lease);
      if (p0Only && answer.attempts.length === 0) {
        await Promise.race([new Promise((resolve) => (slotFreed = resolve)), sleep(100)]);
      }
    } catch (err) {
      if (stop.signal.aborted) return; // deregistering releases whatever that answer held
      if (err.status === 404 || err.status === 410) await register(); // deregistered, or unknown
      else if (err.status === 401 || err.status === 403) throw err;
      else (say(`lease failed: ${err.message}; trying again`), await sleep(1000));
    }
  }
}

function begin(lease) {
  const controller = new AbortController();
  const entry = { lease, controller, lines: [], shipping: Promise.resolve(), progress: undefined };
  entry.ctx = {
    runId: lease.run_id,
    attemptId: lease.attempt_id,
    attempt: lease.attempt,
    fencingToken: lease.fencing_token,
    idempotencyKey: `${lease.run_id}:${lease.attempt}`,
    signal: controller.signal,
    log: (level, message) => {
      say(`${lease.task} ${lease.run_id}: ${level} ${message}`);
      entry.lines.push({ ts: new Date().toISOString(), level, message: String(message) });
    },
    progress: (details) => (entry.progress = details ?? null),
  };
  held.set(lease.attempt_id, entry);
  leased();
  // The time left to the deadline, measured on the server's clock alone: the lease was
  // granted `heartbeat_timeout` seconds before it expires.
  const granted = Date.parse(lease.lease_expires_at) - lease.heartbeat_timeout * 1000;
  const budget = Math.min(Date.parse(lease.deadline) - granted, 2 ** 31 - 1);
  const timer = setTimeout(() => controller.abort(new Error("the attempt reached its deadline")), budget);
  execute(entry).finally(() => clearTimeout(timer));
}

async function execute(entry) {
  const { lease, ctx } = entry;
  let outcome;
  try {
    const handler = config.tasks.includes(lease.task) ? handlers[lease.task] : undefined;
    if (!handler) {
      const what = lease.task === null ? "a webhook run" : `task ${lease.task}`;
      throw new NonRetryableError(`no handler for ${what} on this worker`);
    }
    outcome = { complete: { result: (await handler(ctx, lease.payload)) ?? null } };
  } catch (err) {
    const error = `${err?.name ?? "Error"}: ${err?.message ?? err}`.slice(0, 20000);
    outcome = { fail: { error, retryable: !(err instanceof NonRetryableError) } };
  }
  if (entry.lost || entry.released) return; // the run is someone else's now
  try {
    await shipLogs(entry); // before the outcome: lines are kept only while it is live
    const [kind, body] = Object.entries(outcome)[0];
    const path = `/v1/attempts/${lease.attempt_id}/${kind}`;
    const answer = await persist(() => call("POST", path, { fencing_token: lease.fencing_token, ...body }));
    const what = kind === "complete" ? "completed" : `failed (${body.error})`;
    say(`${lease.task} ${lease.run_id}: ${what}; run ${answer.run_state}`);
  } catch (err) {
    say(`${lease.task} ${lease.run_id}: outcome not recorded: ${err.message}`); // 409: the lease was lost
  } finally {
    forget(entry);
  }
}

function forget(entry) {
  held.delete(entry.lease.attempt_id);
  slotFreed();
}

// An attempt's lines go in order, one request at a time, up to 1,000 lines each.
function shipLogs(entry) {
  entry.shipping = entry.shipping.then(async () => {
    while (entry.lines.length > 0) {
      const body = { fencing_token: entry.lease.fencing_token, lines: entry.lines.splice(0, 1000) };
      try {
        await persist(() => call("POST", `/v1/attempts/${entry.lease.attempt_id}/logs`, body), 3);
      } catch (err) {
        say(`log lines dropped: ${err.message}`); // 409: the attempt has ended
        entry.lines.length = 0;
      }
    }
  });
  return entry.shipping;
}

// Seconds between heartbeats: the server's interval, and often enough for every lease
// and progress deadline held.
function heartbeatPeriod() {
  let period = worker.heartbeat_interval;
  for (const { lease } of held.values()) {
    period = Math.min(period, lease.heartbeat_timeout / 3);
    if (lease.progress_timeout) period = Math.min(period, lease.progress_timeout / 4);
  }
  return Math.max(period, 0.05);
}

// Resolves after `ms`, or sooner when an attempt is leased.
const nap = (ms) =>
  new Promise((resolve) => {
    const timer = setTimeout(resolve, Math.min(ms, 2 ** 31 - 1));
    leased = () => (clearTimeout(timer), resolve());
  });

async function heartbeatLoop() {
  let last = Date.now();
  for (;;) {
    if (held.size === 0) {
      await nap(Infinity);
      last = Date.now(); // a fresh lease needs no beat yet
      continue;
    }
    const due = last + heartbeatPeriod() * 1000;
    if (Date.now() < due) {
      await nap(due - Date.now());
      continue;
    }
    last = Date.now();
    await beat();
  }
}

// One request beats every attempt held; the answer says which were cancelled and which
// leases were lost.
async function beat() {
  const entries = [...held.values()];
  const heartbeats = entries.map((e) => {
    const item = { attempt_id: e.lease.attempt_id, fencing_token: e.lease.fencing_token };
    if (e.progress !== undefined) Object.assign(item, { progress: true, details: e.progress });
    e.progress = undefined;
    return item;
  });
  try {
    const answer = await call("POST", "/v1/attempts/batch", { heartbeats });
    answer.heartbeats.forEach((outcome, i) => {
      const entry = entries[i];
      if (!outcome.ok) {
        // A stale token: the run is someone else's now, and a result would be refused.
        // Its slot is free at once; the handler stops when it looks at ctx.signal.
        entry.lost = true;
        entry.controller.abort(new Error(`lease lost (${outcome.error})`));
        forget(entry);
      } else if (outcome.cancel_requested) {
        entry.controller.abort(new Error("the run was cancelled"));
      }
    });
    // The lines of long handlers go as they come, not only at the end.
    await Promise.all(entries.filter((e) => !e.lost).map(shipLogs));
  } catch (err) {
    say(`heartbeat failed: ${err.message}`);
  }
}

async function shutdown(signal) {
  if (stop.signal.aborted) return;
  if (worker === undefined) process.exit(0); // not registered yet: nothing to hand back
  say(`${signal}: stopping; running handlers get ${config.gracePeriod} s`);
  stop.abort(new Error("shutting down"));
  const until = Date.now() + config.gracePeriod * 1000;
  while (held.size > 0 && Date.now() < until) await sleep(50);
  const left = [...held.values()];
  if (left.length > 0) {
    for (const entry of left) {
      entry.released = true;
      entry.controller.abort(new Error("the worker is shutting down"));
      forget(entry);
    }
    const releases = left.map(({ lease }) => ({
      attempt_id: lease.attempt_id,
      fencing_token: lease.fencing_token,
    }));
    await persist(() => call("POST", "/v1/attempts/batch", { releases }), 3).catch((err) =>
      say(`release failed: ${err.message}`),
    );
  }
  try {
    const answer = await persist(() => call("DELETE", `/v1/workers/${worker.worker_id}`), 3);
    const released = `${left.length} handed back, ${answer.released} released by the server`;
    say(`deregistered worker ${worker.worker_id} (${released})`);
    process.exit(0);
  } catch (err) {
    say(`deregister failed: ${err.message}`); // the leases expire on their own
    process.exit(1);
  }
}

if (!config.key) {
  console.error("CRONWHEEL_API_KEY is not set: give the worker a worker key");
  process.exit(2);
}
if (!Number.isInteger(config.capacity) || config.capacity < 1 || !(config.gracePeriod >= 0)) {
  console.error("CRONWHEEL_CAPACITY must be a whole number from 1, CRONWHEEL_GRACE_PERIOD a number from 0");
  process.exit(2);
}
process.on("SIGTERM", () => shutdown("SIGTERM"));
process.on("SIGINT", () => shutdown("SIGINT"));
try {
  await register();
  heartbeatLoop();
  await leaseLoop();
} catch (err) {
  console.error(`[worker] giving up: ${err.message}`); // a bad key, or no server at all
  process.exit(1);
}
