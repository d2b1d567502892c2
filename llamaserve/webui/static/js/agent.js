// The agent loop's server side: the tools the server offers (GET /tools), running one
// (POST /tools, the shell's output streamed), and what the model is told of the result.

import { apiFetch, errorFrom, readSSE } from "./api.js";

// Tools whose output streams as it comes (llama-server streams only this one).
const STREAMING = new Set(["exec_shell_command"]);

/** The server's tools, [] when it has none (403) or cannot say. */
export async function loadTools() {
  try {
    const res = await apiFetch("/tools");
    if (!res.ok) return [];
    const list = await res.json();
    return Array.isArray(list) ? list.filter((t) => t && t.definition && t.tool) : [];
  } catch {
    return [];
  }
}

/** Whether the user must agree before the tool runs: it writes or executes. */
export function needsApproval(tool) {
  return !!(tool && tool.permissions && tool.permissions.write);
}

/** name + arguments, with the arguments' keys in a fixed order: two identical calls compare equal. */
export function callKey(call) {
  let args = call.function?.arguments || "";
  try { args = JSON.stringify(sortKeys(JSON.parse(args || "{}"))); } catch { /* compare the raw text */ }
  return `${call.function?.name || ""}\u0000${args}`;
}

function sortKeys(v) {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (v && typeof v === "object") return Object.fromEntries(Object.keys(v).sort().map((k) => [k, sortKeys(v[k])]));
  return v;
}

/** The text the model reads back for a tool's answer. */
export function resultText(body) {
  if (body == null) return "";
  if (typeof body.error === "string" && body.error) return `Error: ${body.error}`;
  if (typeof body.plain_text_response === "string") return body.plain_text_response;
  if (typeof body.result === "string" && Object.keys(body).length <= 3) return body.result;
  return JSON.stringify(body);
}

/**
 * Run one call. onChunk(text) sees the output so far of a streaming tool. Resolves to
 * { text, error }: error is true when the call failed (the model is told so in the text).
 */
export async function runTool(call, { signal, onChunk }) {
  const name = call.function?.name || "";
  let params;
  try {
    params = JSON.parse(call.function?.arguments || "{}");
    if (!params || typeof params !== "object" || Array.isArray(params)) throw new Error("not an object");
  } catch {
    return { text: "Error: the tool call's arguments are not a JSON object.", error: true };
  }
  const stream = STREAMING.has(name);
  const res = await apiFetch("/tools", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ tool: name, params, stream }),
    signal,
  });
  if (!res.ok) {
    const err = await errorFrom(res);
    return { text: `Error: ${err.message}`, error: true };
  }
  if (!stream) {
    const body = await res.json();
    return { text: resultText(body), error: typeof body?.error === "string" };
  }
  let text = "";
  let error = "";
  for await (const ev of readSSE(res)) {
    let data;
    try { data = JSON.parse(ev.data); } catch { continue; }
    if (typeof data.chunk === "string") {
      text += data.chunk;
      onChunk?.(text);
    }
    if (data.done) { error = data.error || ""; break; }
  }
  if (error) text += `${text ? "\n" : ""}Error: ${error}`;
  return { text, error: !!error };
}
