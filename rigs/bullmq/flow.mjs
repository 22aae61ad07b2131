// The BullMQ group-send flow that groupcast grew from, as the comparison
// baseline of `groupcast bench --user-path --against bullmq`.
//
// It is kept as the flow was described, not optimised: one BullMQ queue,
// one job per chunk, two internal jobs (`group.create`, `group.send`) and a
// completion poll, every provider call inside a job that passes the queue's
// limiter, and the races settled with `SET NX` and jobId dedupe.
//
//   node flow.mjs producer --dir DIR --template FILE --chunk-size N [--batch-prefix bench]
//   node flow.mjs worker
//
// Both read REDIS_URL; the worker also PROVIDER_URL, PROVIDER_API_KEY,
// PROVIDER_API_SECRET, CONCURRENCY (8), LIMIT_MAX / LIMIT_DURATION_MS (the
// limiter: at most LIMIT_MAX jobs per LIMIT_DURATION_MS, all workers
// together; 10000 per 1000 ms by default, which the mock never reaches, as
// groupcast's default limiter is unpaced until the provider pushes back).
//
// Redis keys of the flow itself (besides BullMQ's own `bull:notify:*`):
//   bmq:group:{batch}     the batch's group id (SET NX by group.create)
//   bmq:loaded:{batch}    hash: s{seq} -> messages registered, `last` -> N
//   bmq:sent:{groupId}    the send's done-marker (SET NX)
//   bmq:reported:{batch}  the report's guard (SET NX)
//   bmq:reports           stream: one entry per report that went out

import { createHmac, randomBytes } from "node:crypto";
import { createReadStream, readdirSync, readFileSync } from "node:fs";
import { join, basename } from "node:path";
import { createInterface } from "node:readline";

import {
  DelayedError,
  Queue,
  UnrecoverableError,
  WaitingChildrenError,
  Worker,
} from "bullmq";
import IORedis from "ioredis";

const QUEUE = "notify";
// Jobs added at a time by the producer (as groupcast's bench appends 50
// chunks at a time).
const ADD_BULK = 50;
// groupcast's worker reads a sent group first after 100 ms, then twice as
// long each time, at most 500 ms apart: the poll job does the same.
const FIRST_POLL_MS = 100;
const MAX_POLL_MS = 500;
// Every job: retried with exponential backoff (5xx, dropped connections),
// kept an hour once completed, kept when failed (to be looked at).
const JOB_OPTIONS = {
  attempts: 5,
  backoff: { type: "exponential", delay: 200 },
  removeOnComplete: { age: 3600 },
  removeOnFail: false,
};

const env = (name, fallback) => {
  const v = process.env[name];
  if (v === undefined || v === "") {
    if (fallback === undefined) {
      throw new Error(`${name} is not set`);
    }
    return fallback;
  }
  return v;
};

function connection() {
  const url = new URL(env("REDIS_URL", "redis://127.0.0.1:6379/"));
  return {
    host: url.hostname,
    port: Number(url.port || 6379),
    // BullMQ's workers need this (their blocking commands must not time out).
    maxRetriesPerRequest: null,
  };
}

// ---------------------------------------------------------------- producer

function parseArgs(argv) {
  const out = {};
  for (let i = 0; i < argv.length; i += 2) {
    out[argv[i].replace(/^--/, "")] = argv[i + 1];
  }
  return out;
}

// The batch's recipients, as `{to, name}`, one chunk at a time, each with
// whether it is the last one (read one chunk ahead).
async function* chunksOf(file, size) {
  const lines = createInterface({ input: createReadStream(file), crlfDelay: Infinity });
  let header = null;
  let chunk = [];
  let pending = null;
  for await (const line of lines) {
    if (line.trim() === "") continue;
    const cols = line.split(",");
    if (header === null) {
      header = cols.map((c) => c.trim());
      continue;
    }
    const row = {};
    header.forEach((h, i) => (row[h] = cols[i] ?? ""));
    chunk.push({ to: row.to, name: row.name });
    if (chunk.length === size) {
      if (pending) yield { recipients: pending, last: false };
      pending = chunk;
      chunk = [];
    }
  }
  if (chunk.length > 0) {
    if (pending) yield { recipients: pending, last: false };
    pending = chunk;
  }
  if (pending) yield { recipients: pending, last: true };
}

async function producer(argv) {
  const args = parseArgs(argv);
  const dir = args.dir;
  const size = Number(args["chunk-size"]);
  const prefix = args["batch-prefix"] ?? "bench";
  const template = JSON.parse(readFileSync(args.template, "utf8"));
  const queue = new Queue(QUEUE, { connection: connection(), defaultJobOptions: JOB_OPTIONS });
  // Files in their batches' order: 0.csv, 1.csv, ...
  const files = readdirSync(dir)
    .filter((f) => f.endsWith(".csv"))
    .sort((a, b) => a.localeCompare(b, "en", { numeric: true }));
  let chunks = 0;
  for (const f of files) {
    const batchKey = `${prefix}-${basename(f, ".csv")}`;
    let seq = 0;
    let bulk = [];
    for await (const c of chunksOf(join(dir, f), size)) {
      bulk.push({
        name: "chunk",
        data: { batchKey, seq, isLast: c.last, template, recipients: c.recipients },
      });
      seq += 1;
      if (bulk.length === ADD_BULK) {
        await queue.addBulk(bulk);
        bulk = [];
      }
    }
    if (bulk.length > 0) await queue.addBulk(bulk);
    chunks += seq;
  }
  await queue.close();
  console.log(JSON.stringify({ chunks, batches: files.length }));
}

// ---------------------------------------------------------------- provider

class ProviderError extends Error {
  constructor(status, body) {
    super(`provider answered ${status}: ${body}`);
    this.status = status;
  }
}

function provider() {
  const base = env("PROVIDER_URL");
  const key = env("PROVIDER_API_KEY");
  const secret = env("PROVIDER_API_SECRET");
  return async (method, path, body) => {
    const date = new Date().toISOString();
    const salt = randomBytes(16).toString("hex");
    const signature = createHmac("sha256", secret).update(date + salt).digest("hex");
    const res = await fetch(base + path, {
      method,
      headers: {
        Authorization: `HMAC-SHA256 apiKey=${key}, date=${date}, salt=${salt}, signature=${signature}`,
        "Content-Type": "application/json",
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    if (!res.ok) {
      const e = new ProviderError(res.status, text);
      // A client error is the same on every attempt: no retry (the jobs'
      // retries are for 5xx, 429 and dropped connections).
      if ([400, 401, 403, 404, 413].includes(res.status)) {
        const u = new UnrecoverableError(e.message);
        u.status = res.status;
        throw u;
      }
      throw e;
    }
    return text === "" ? {} : JSON.parse(text);
  };
}

// ------------------------------------------------------------------ worker

function render(text, vars) {
  return text.replace(/#\{([^}]*)\}/g, (all, name) => (name in vars ? vars[name] : all));
}

async function worker() {
  const redis = new IORedis(connection());
  const queue = new Queue(QUEUE, { connection: connection(), defaultJobOptions: JOB_OPTIONS });
  const call = provider();

  const groupKey = (batchKey) => `bmq:group:${batchKey}`;

  // A chunk: wait for the batch's group (a `group.create` child), add the
  // chunk's messages to it (one request), record the share, and the one
  // that sees every share recorded asks for the send.
  async function chunk(job, token) {
    const { batchKey, seq, isLast, template, recipients } = job.data;
    let groupId = await redis.get(groupKey(batchKey));
    if (!groupId) {
      await queue.add(
        "group.create",
        { batchKey },
        {
          // Per seq, not per batch: a second add of one jobId is absorbed
          // without its parent link, and that parent would never wake.
          jobId: `create-${seq}-${batchKey}`,
          parent: { id: job.id, queue: job.queueQualifiedName },
          failParentOnFailure: true,
        },
      );
      if (await job.moveToWaitingChildren(token)) {
        throw new WaitingChildrenError();
      }
      // The child finished before we could sleep: its id is stored.
      groupId = await redis.get(groupKey(batchKey));
      if (!groupId) throw new Error(`no group for ${batchKey} after group.create`);
    }
    const messages = recipients.map((r) => ({
      to: r.to,
      from: template.from,
      type: template.type,
      text: render(template.text, { name: r.name }),
    }));
    const res = await call("PUT", `/messages/v4/groups/${groupId}/messages`, { messages });
    // "2000" registered now, "1026" registered by an earlier attempt of
    // this chunk (the group refuses duplicates).
    const registered = (res.resultList ?? []).filter(
      (r) => r.statusCode === "2000" || r.statusCode === "1026",
    ).length;
    // Recorded only once the whole chunk is in: a retry adds it all again.
    const loaded = `bmq:loaded:${batchKey}`;
    const m = redis.multi().hset(loaded, `s${seq}`, registered);
    if (isLast) m.hset(loaded, "last", seq);
    const replies = await m.hlen(loaded).hget(loaded, "last").exec();
    const [hlen, last] = replies.slice(-2).map(([err, v]) => {
      if (err) throw err;
      return v;
    });
    // The count equation: every seq of 0..=last recorded (the `last`
    // field is one of the hash's fields).
    if (last !== null && hlen - 1 === Number(last) + 1) {
      await queue.add(
        "group.send",
        { batchKey, groupId },
        { jobId: `send-${groupId}` },
      );
    }
  }

  // Creates the batch's group; the id is stored once, the loser of a race
  // deletes its own empty group.
  async function groupCreate(job) {
    const { batchKey } = job.data;
    const stored = await redis.get(groupKey(batchKey));
    if (stored) return stored;
    const g = await call("POST", "/messages/v4/groups", {
      allowDuplicates: false,
      customFields: { batchId: batchKey, generation: "0" },
    });
    if ((await redis.set(groupKey(batchKey), g.groupId, "NX")) === "OK") {
      return g.groupId;
    }
    await call("DELETE", `/messages/v4/groups/${g.groupId}`);
    return redis.get(groupKey(batchKey));
  }

  // Sends a complete group once: the done-marker first, then the
  // provider's own status (a send whose answer was lost left no marker).
  async function groupSend(job) {
    const { batchKey, groupId } = job.data;
    const done = `bmq:sent:${groupId}`;
    if (!(await redis.get(done))) {
      const g = await call("GET", `/messages/v4/groups/${groupId}`);
      if (g.status === "PENDING") {
        // Fail closed when the provider holds fewer than were recorded.
        const shares = await redis.hgetall(`bmq:loaded:${batchKey}`);
        const recorded = Object.entries(shares)
          .filter(([k]) => k.startsWith("s"))
          .reduce((n, [, v]) => n + Number(v), 0);
        if (g.count.registeredSuccess !== recorded) {
          throw new UnrecoverableError(
            `${batchKey}: ${g.count.registeredSuccess} registered, ${recorded} recorded`,
          );
        }
        try {
          await call("POST", `/messages/v4/groups/${groupId}/send`);
        } catch (e) {
          // 409: it was sent already (the answer to an earlier try was lost).
          if (!(e instanceof ProviderError && e.status === 409)) throw e;
        }
      }
      await redis.set(done, "1", "NX");
    }
    await queue.add(
      "group.poll",
      { batchKey, groupId, wait: FIRST_POLL_MS },
      { jobId: `poll-${groupId}`, delay: FIRST_POLL_MS },
    );
  }

  // Observes the batch's completion at the provider, then reports it once.
  async function groupPoll(job, token) {
    const { batchKey, groupId, wait } = job.data;
    const g = await call("GET", `/messages/v4/groups/${groupId}`);
    if (g.status !== "COMPLETE" && g.status !== "FAILED") {
      const next = Math.min(wait * 2, MAX_POLL_MS);
      await job.updateData({ ...job.data, wait: next });
      await job.moveToDelayed(Date.now() + next, token);
      throw new DelayedError();
    }
    if ((await redis.set(`bmq:reported:${batchKey}`, groupId, "NX")) === "OK") {
      await redis.xadd(
        "bmq:reports",
        "*",
        "batch", batchKey,
        "groupId", groupId,
        "status", g.status,
        "registered", String(g.count.registeredSuccess),
        "sentSuccess", String(g.count.sentSuccess),
      );
    }
  }

  const handlers = {
    chunk,
    "group.create": groupCreate,
    "group.send": groupSend,
    "group.poll": groupPoll,
  };
  const w = new Worker(
    QUEUE,
    async (job, token) => {
      const h = handlers[job.name];
      if (!h) throw new UnrecoverableError(`unknown job ${job.name}`);
      return h(job, token);
    },
    {
      connection: connection(),
      concurrency: Number(env("CONCURRENCY", "8")),
      // Every provider call is made inside a job of this queue: the
      // limiter counts them all.
      limiter: {
        max: Number(env("LIMIT_MAX", "10000")),
        duration: Number(env("LIMIT_DURATION_MS", "1000")),
      },
    },
  );
  w.on("failed", (job, err) => {
    console.error(`job ${job?.name} ${job?.id} failed: ${err?.message}`);
  });
  w.on("error", (err) => console.error(`worker error: ${err?.message}`));
  await w.waitUntilReady();
  await queue.waitUntilReady();
  console.log("worker ready");
  const stop = async () => {
    await w.close();
    await queue.close();
    redis.disconnect();
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

// ------------------------------------------------------------------- main

const [mode, ...rest] = process.argv.slice(2);
const run = { producer: () => producer(rest), worker }[mode];
if (!run) {
  console.error("usage: node flow.mjs producer|worker ...");
  process.exit(2);
}
run().catch((e) => {
  console.error(e?.stack ?? String(e));
  process.exit(1);
});
