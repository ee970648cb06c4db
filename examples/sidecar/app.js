// A small application beside runq, in Node.js with no dependencies (node >= 18).
//
// It plays both sides of the sidecar contract (docs/sidecar.md):
//   - it SUBMITS runs to runq over HTTP:   POST /documents/:id/render  -> POST {RUNQ_URL}/runs
//   - it SERVES the callback runq makes:   POST /render                (kind = "http")
//       * a payload with "approval": true is paused for a human on the first attempt
//         and finished with the decision when the run is continued;
//       * a payload with "slow": true answers 202 + Location, and runq polls it;
//   - for a demo without a provider key, it also serves a stand-in for an
//     OpenAI-compatible endpoint at POST /v1/chat/completions (kind = "openai-chat").
//
// Environment: APP_PORT (8080), APP_TOKEN (the token runq must present), RUNQ_URL.

"use strict";
const http = require("node:http");
const crypto = require("node:crypto");

const PORT = Number(process.env.APP_PORT || 8080);
const TOKEN = process.env.APP_TOKEN || "";
const RUNQ_URL = process.env.RUNQ_URL || "http://127.0.0.1:7777";
const jobs = new Map(); // slow renders: job id -> {readyAt, result}

function send(res, status, body, headers = {}) {
  const text = body === undefined ? "" : JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(text);
}

async function readJson(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const text = Buffer.concat(chunks).toString("utf8");
  return text ? JSON.parse(text) : null;
}

function authorised(req) {
  return TOKEN !== "" && req.headers["authorization"] === `Bearer ${TOKEN}`;
}

// -- the callback runq calls (kind = "http") ------------------------------------------------

async function render(req, res) {
  if (!authorised(req)) return send(res, 401, { error: "bad token" }); // permanent in runq
  const runId = req.headers["runq-run-id"];
  const attempt = req.headers["runq-attempt"];
  let payload = await readJson(req);
  let decision = null;
  if (req.headers["runq-resume"] === "1") {
    // A continued run: {"payload": ..., "resume": {"state": ..., "decision": ...}}
    decision = payload.resume.decision;
    payload = payload.payload;
  }
  console.log(`render run=${runId} attempt=${attempt} resume=${decision !== null}`);

  if (!payload || typeof payload.doc !== "string") {
    return send(res, 422, { error: "payload.doc (a string) is required" }); // permanent
  }
  if (payload.approval && decision === null) {
    // Ask runq to pause the run until someone decides; the state comes back on resume.
    return send(res, 200, {
      runq: { pause: { reason: "approval", state: { preview: `<h1>${payload.doc}</h1>` } } },
    });
  }
  if (decision !== null && !decision.approved) {
    return send(res, 200, { published: false, doc: payload.doc });
  }
  if (payload.slow) {
    const id = crypto.randomUUID();
    jobs.set(id, { readyAt: Date.now() + 3000, result: { html: `<h1>${payload.doc}</h1>` } });
    return send(res, 202, { accepted: id }, { location: `/render/jobs/${id}`, "retry-after": "1" });
  }
  send(res, 200, { html: `<h1>${payload.doc}</h1>`, published: decision !== null });
}

function renderJob(req, res, id) {
  if (!authorised(req)) return send(res, 401, { error: "bad token" });
  const job = jobs.get(id);
  if (!job) return send(res, 404, { error: "no such job" });
  if (Date.now() < job.readyAt) return send(res, 202, { pending: id }, { "retry-after": "1" });
  jobs.delete(id);
  send(res, 200, job.result);
}

// -- a stand-in for an OpenAI-compatible provider (kind = "openai-chat") --------------------

async function chatCompletions(req, res) {
  if (req.headers["authorization"] !== `Bearer ${process.env.OPENAI_API_KEY || ""}`) {
    return send(res, 401, { error: { message: "Incorrect API key", code: "invalid_api_key" } });
  }
  const body = await readJson(req);
  const last = body.messages[body.messages.length - 1].content;
  const words = String(last).split(/\s+/).filter(Boolean);
  const summary = words.slice(0, 5).join(" ") + (words.length > 5 ? " ..." : "");
  const prompt = JSON.stringify(body.messages).length / 4;
  send(res, 200, {
    id: "chatcmpl-demo",
    object: "chat.completion",
    model: body.model,
    choices: [{ index: 0, message: { role: "assistant", content: summary }, finish_reason: "stop" }],
    usage: {
      prompt_tokens: Math.ceil(prompt),
      completion_tokens: words.length,
      total_tokens: Math.ceil(prompt) + words.length,
    },
  });
}

// -- the application submitting work to runq ------------------------------------------------

async function submitRender(req, res, docId) {
  const response = await fetch(`${RUNQ_URL}/runs`, {
    method: "POST",
    headers: { "content-type": "application/json", "idempotency-key": `render-${docId}` },
    body: JSON.stringify({
      component_type: "task",
      component_id: "render",
      payload: { doc: docId },
    }),
  });
  send(res, response.status, await response.json());
}

const server = http.createServer(async (req, res) => {
  try {
    const url = new URL(req.url, "http://app");
    const job = url.pathname.match(/^\/render\/jobs\/([\w-]+)$/);
    const doc = url.pathname.match(/^\/documents\/([\w-]+)\/render$/);
    if (req.method === "POST" && url.pathname === "/render") return await render(req, res);
    if (req.method === "GET" && job) return renderJob(req, res, job[1]);
    if (req.method === "POST" && url.pathname === "/v1/chat/completions") {
      return await chatCompletions(req, res);
    }
    if (req.method === "POST" && doc) return await submitRender(req, res, doc[1]);
    if (req.method === "GET" && url.pathname === "/healthz") return send(res, 200, { ok: true });
    send(res, 404, { error: "not found" });
  } catch (err) {
    console.error(err);
    send(res, 500, { error: "internal" }); // retryable in runq
  }
});

server.listen(PORT, "127.0.0.1", () => console.log(`app listening on 127.0.0.1:${PORT}`));
process.on("SIGTERM", () => server.close(() => process.exit(0)));
