// Conversation storage: IndexedDB, with localStorage as a fallback where IndexedDB is unavailable
// (some private-browsing modes). Every function is async and works on plain JSON objects.
//
// A conversation: { id, title, createdAt, updatedAt, messages: [Message] }
// A message:      { id, role: "user" | "assistant", content, createdAt,
//                   reasoning?, toolCalls?, timings?, finishReason?, stopped?, error?, model?,
//                   attachments?: [{ kind: "image" | "audio", name, mime, url (a data: URL) }] }

const DB_NAME = "llamaserve-webui";
const STORE = "conversations";
const LS_KEY = "llamaserve.conversations";

export function newId() {
  if (globalThis.crypto?.randomUUID) return crypto.randomUUID();
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 10);
}

class IdbBackend {
  constructor(db) { this.db = db; }

  static open() {
    return new Promise((resolve, reject) => {
      if (!globalThis.indexedDB) { reject(new Error("IndexedDB unavailable")); return; }
      const req = indexedDB.open(DB_NAME, 1);
      req.onupgradeneeded = () => {
        const store = req.result.createObjectStore(STORE, { keyPath: "id" });
        store.createIndex("updatedAt", "updatedAt");
      };
      req.onsuccess = () => resolve(new IdbBackend(req.result));
      req.onerror = () => reject(req.error);
      req.onblocked = () => reject(new Error("IndexedDB blocked"));
    });
  }

  run(mode, fn) {
    return new Promise((resolve, reject) => {
      const tx = this.db.transaction(STORE, mode);
      const req = fn(tx.objectStore(STORE));
      tx.oncomplete = () => resolve(req?.result);
      tx.onerror = () => reject(tx.error);
      tx.onabort = () => reject(tx.error || new Error("transaction aborted"));
    });
  }

  all() { return this.run("readonly", (s) => s.getAll()); }
  get(id) { return this.run("readonly", (s) => s.get(id)); }
  put(conv) { return this.run("readwrite", (s) => s.put(conv)); }
  delete(id) { return this.run("readwrite", (s) => s.delete(id)); }
}

class LocalBackend {
  read() {
    try { return JSON.parse(localStorage.getItem(LS_KEY) || "{}"); } catch { return {}; }
  }
  write(map) { localStorage.setItem(LS_KEY, JSON.stringify(map)); }
  async all() { return Object.values(this.read()); }
  async get(id) { return this.read()[id]; }
  async put(conv) { const m = this.read(); m[conv.id] = conv; this.write(m); }
  async delete(id) { const m = this.read(); delete m[id]; this.write(m); }
}

let backendPromise = null;

function backend() {
  if (!backendPromise) {
    backendPromise = IdbBackend.open().catch((err) => {
      console.warn("llamaserve: IndexedDB unavailable, keeping conversations in localStorage", err);
      return new LocalBackend();
    });
  }
  return backendPromise;
}

/** Plain, storable copy (drops anything a structured clone would choke on). */
function plain(conv) {
  return JSON.parse(JSON.stringify(conv));
}

export async function listConversations() {
  const all = await (await backend()).all();
  return all.sort((a, b) => (b.updatedAt || 0) - (a.updatedAt || 0));
}

export async function getConversation(id) {
  return (await backend()).get(id);
}

export async function saveConversation(conv) {
  await (await backend()).put(plain(conv));
}

export async function deleteConversation(id) {
  await (await backend()).delete(id);
}

// ------------------------------------------------------------------ import / export

export const EXPORT_FORMAT = "llamaserve-webui";

export function exportPayload(conversations) {
  return {
    format: EXPORT_FORMAT,
    version: 1,
    exported_at: new Date().toISOString(),
    conversations: conversations.map(plain),
  };
}

function str(v) { return typeof v === "string" ? v : v == null ? "" : String(v); }

function cleanMessage(m) {
  if (!m || typeof m !== "object") return null;
  const role = m.role === "user" || m.role === "assistant" ? m.role : null;
  if (!role) return null;
  let content = m.content;
  if (Array.isArray(content)) {  // OpenAI content parts: keep the text ones
    content = content.map((p) => (p && p.type === "text" ? str(p.text) : "")).join("");
  }
  const out = { id: str(m.id) || newId(), role, content: str(content), createdAt: Number(m.createdAt) || Date.now() };
  const reasoning = m.reasoning ?? m.reasoning_content;
  if (reasoning) out.reasoning = str(reasoning);
  const calls = m.toolCalls ?? m.tool_calls;
  if (Array.isArray(calls) && calls.length) out.toolCalls = calls;
  if (m.timings && typeof m.timings === "object") out.timings = m.timings;
  for (const k of ["finishReason", "model", "error"]) if (m[k]) out[k] = str(m[k]);
  if (m.stopped) out.stopped = true;
  return out;
}

function cleanConversation(c) {
  if (!c || typeof c !== "object" || !Array.isArray(c.messages)) return null;
  const messages = c.messages.map(cleanMessage).filter(Boolean);
  const now = Date.now();
  return {
    id: str(c.id) || newId(),
    title: str(c.title || c.name) || titleFrom(messages) || "Imported chat",
    createdAt: Number(c.createdAt) || now,
    updatedAt: Number(c.updatedAt) || now,
    messages,
  };
}

/**
 * Accepts our export, a bare array of conversations, or one conversation.
 * Returns the cleaned conversations; throws on anything else.
 */
export function parseImport(text) {
  let data;
  try { data = JSON.parse(text); } catch { throw new Error("The file is not valid JSON."); }
  let list;
  if (Array.isArray(data)) list = data;
  else if (data && Array.isArray(data.conversations)) list = data.conversations;
  else if (data && Array.isArray(data.messages)) list = [data];
  else throw new Error("No conversations found in the file.");
  const out = list.map(cleanConversation).filter(Boolean);
  if (!out.length) throw new Error("No conversations found in the file.");
  return out;
}

export function titleFrom(messages) {
  const first = messages.find((m) => m.role === "user" && m.content.trim());
  if (!first) return "";
  const line = first.content.trim().replace(/\s+/g, " ");
  return line.length > 60 ? line.slice(0, 57).trimEnd() + "…" : line;
}
