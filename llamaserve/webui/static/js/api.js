// Talking to the server: authenticated fetch (with a one-at-a-time API key prompt on 401),
// the SSE reader, and the streaming chat request.

const KEY_STORAGE = "llamaserve.apiKey";

export function getApiKey() {
  try { return localStorage.getItem(KEY_STORAGE) || ""; } catch { return ""; }
}

export function setApiKey(key) {
  try {
    if (key) localStorage.setItem(KEY_STORAGE, key);
    else localStorage.removeItem(KEY_STORAGE);
  } catch { /* storage disabled: the key lives only as long as the page */ }
}

let prompter = null;      // async (reason) => key | null, installed by the app
let pendingPrompt = null; // the prompt being shown: every 401 meanwhile waits on the same one

export function setKeyPrompter(fn) { prompter = fn; }

export class ApiError extends Error {
  constructor(message, status = 0, type = "") {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.type = type;
  }
}

/**
 * fetch() against the same origin with the stored key as a Bearer token. On 401 the user is
 * asked for a key (one dialog, however many requests failed together) and the request is
 * retried with it; a cancelled prompt returns the 401 response to the caller.
 */
export async function apiFetch(path, init = {}) {
  for (;;) {
    const used = getApiKey();
    const headers = new Headers(init.headers || {});
    if (used) headers.set("Authorization", `Bearer ${used}`);
    const res = await fetch(path, { ...init, headers });
    if (res.status !== 401 || !prompter) return res;
    if (getApiKey() !== used) continue;  // another prompt already replaced the key: retry with it
    if (!pendingPrompt) {
      const reason = used ? "The server did not accept the saved API key." : "This server requires an API key.";
      pendingPrompt = Promise.resolve(prompter(reason)).finally(() => { pendingPrompt = null; });
    }
    const key = await pendingPrompt;
    if (!key) return res;
    if (getApiKey() !== key) setApiKey(key);
    init.signal?.throwIfAborted?.();
  }
}

/** The server's error message from a failed response (llama-server and OpenAI shapes). */
export async function errorFrom(res) {
  let message = `${res.status} ${res.statusText}`.trim();
  let type = "";
  try {
    const text = await res.text();
    try {
      const body = JSON.parse(text);
      const err = body.error ?? body;
      if (typeof err === "string") message = err;
      else if (err && err.message) { message = err.message; type = err.type || ""; }
    } catch {
      if (text.trim()) message = text.trim().slice(0, 300);
    }
  } catch { /* keep the status line */ }
  if (res.status === 401 && !/key/i.test(message)) message = `Unauthorized: ${message}. Set an API key in Settings.`;
  return new ApiError(message, res.status, type);
}

export async function getJSON(path, init = {}) {
  const res = await apiFetch(path, init);
  if (!res.ok) throw await errorFrom(res);
  return res.json();
}

/**
 * Server-sent events from a fetch Response: yields {event, data} per event.
 * llama-server also writes bare `error: {...}` lines for errors in the middle of a stream;
 * those come out as {event: "error", data}.
 */
export async function* readSSE(res) {
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  let data = [];
  let event = "";
  const flush = function* () {
    if (data.length) yield { event: event || "message", data: data.join("\n") };
    data = [];
    event = "";
  };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        let line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line.endsWith("\r")) line = line.slice(0, -1);
        if (line === "") { yield* flush(); continue; }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let val = colon < 0 ? "" : line.slice(colon + 1);
        if (val.startsWith(" ")) val = val.slice(1);
        if (field === "data") data.push(val);
        else if (field === "event") event = val;
        else if (field === "error") { yield* flush(); yield { event: "error", data: val }; }
      }
    }
    if (buf.trim()) {
      const line = buf.replace(/\r$/, "");
      if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
    yield* flush();
  } finally {
    reader.releaseLock?.();
  }
}

function streamError(data) {
  try {
    const body = JSON.parse(data);
    const err = body.error ?? body;
    return new ApiError(typeof err === "string" ? err : err.message || data, err.code || 500, err.type || "");
  } catch {
    return new ApiError(data || "The server reported an error.");
  }
}

/**
 * POST /v1/chat/completions with stream: true. Calls onChunk(chunk) for each parsed JSON chunk
 * until [DONE]. Rejects with an AbortError when `signal` aborts, an ApiError on server errors.
 */
export async function streamChat(body, { signal, onChunk }) {
  const res = await apiFetch("/v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
    body: JSON.stringify({ ...body, stream: true }),
    signal,
  });
  if (!res.ok) throw await errorFrom(res);
  const type = res.headers.get("Content-Type") || "";
  if (!type.includes("text/event-stream")) {
    // A server that ignored stream: true answers with one JSON body; show it all the same.
    const whole = await res.json();
    const choice = whole.choices?.[0] || {};
    const m = choice.message || {};
    onChunk({
      ...whole,
      choices: [{ index: 0, delta: { content: m.content, reasoning_content: m.reasoning_content, tool_calls: m.tool_calls },
                  finish_reason: choice.finish_reason }],
    });
    return;
  }
  for await (const ev of readSSE(res)) {
    if (ev.data === "[DONE]") return;
    if (ev.event === "error") throw streamError(ev.data);
    let chunk;
    try { chunk = JSON.parse(ev.data); } catch { continue; }
    if (chunk.error) throw streamError(ev.data);
    onChunk(chunk);
  }
}
