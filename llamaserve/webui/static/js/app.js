// The chat page: conversations, streaming, editing, settings, theme, drawer, API key prompt.

import * as api from "./api.js";
import * as store from "./store.js";
import * as settings from "./settings.js";
import * as agent from "./agent.js";
import { renderMarkdown, splitThink } from "./markdown.js";

const $ = (id) => document.getElementById(id);

const el = {
  app: $("app"),
  main: $("main"),
  sidebar: $("sidebar"),
  scrim: $("scrim"),
  sidebarToggle: $("sidebar-toggle"),
  sidebarClose: $("sidebar-close"),
  newChat: $("new-chat"),
  newChatTop: $("new-chat-top"),
  convFilter: $("conv-filter"),
  convList: $("conv-list"),
  convEmpty: $("conv-empty"),
  exportBtn: $("export-btn"),
  importBtn: $("import-btn"),
  importFile: $("import-file"),
  modelName: $("model-name"),
  modelSelect: $("model-select"),
  ctxSize: $("ctx-size"),
  themeToggle: $("theme-toggle"),
  settingsButton: $("settings-button"),
  banner: $("banner"),
  bannerText: $("banner-text"),
  bannerRetry: $("banner-retry"),
  scroller: $("scroller"),
  messages: $("messages"),
  empty: $("empty"),
  emptySub: $("empty-sub"),
  suggestions: $("suggestions"),
  jump: $("jump"),
  composer: $("composer"),
  input: $("composer-input"),
  send: $("send-button"),
  stop: $("stop-button"),
  attach: $("attach-button"),
  attachFile: $("attach-file"),
  attachments: $("attachments"),
  live: $("live"),
  toasts: $("toasts"),
  settingsDialog: $("settings-dialog"),
  settingsForm: $("settings-form"),
  settingsError: $("settings-error"),
  settingsReset: $("settings-reset"),
  keyDialog: $("api-key-dialog"),
  keyInput: $("api-key-input"),
  keyMessage: $("api-key-message"),
  toolsFieldset: $("tools-fieldset"),
  toolToggles: $("tool-toggles"),
};

const LS = {
  current: "llamaserve.currentConversation",
  theme: "llamaserve.theme",
  model: "llamaserve.model",
  sidebar: "llamaserve.sidebarCollapsed",
  disabledTools: "llamaserve.disabledTools",
};

/** The server's tools the user has not switched off in Settings. */
function enabledTools() {
  let off = [];
  try { off = JSON.parse(lsGet(LS.disabledTools) || "[]"); } catch { /* none */ }
  return state.tools.filter((t) => !off.includes(t.tool));
}

function lsGet(k) { try { return localStorage.getItem(k); } catch { return null; } }
function lsSet(k, v) {
  try { if (v === null || v === undefined || v === "") localStorage.removeItem(k); else localStorage.setItem(k, v); } catch { /* ignore */ }
}

const state = {
  conversations: [],   // every conversation, newest first
  current: null,       // the open conversation (null: a new, unsaved chat)
  gen: null,           // {controller, conv, msg} while an answer streams
  modelName: "",
  models: [],
  modelStatus: {},
  router: false,
  model: lsGet(LS.model) || "",
  nCtx: 0,
  stick: true,         // keep the view pinned to the newest text
  editing: null,       // id of the user message being edited
  tools: [],           // the server's agent tools (GET /tools), offered to the model
  modalities: { vision: false, audio: false },  // what the model takes besides text (/props)
  pending: [],         // attachments of the message being written: {kind, name, mime, url}
};

const MAX_TOOL_STEPS = 12;     // model turns with tool calls in a row before the loop gives up
const approvals = new Map();   // "<msg id>:<call index>" -> resolve(decision) while the user decides

const views = new Map(); // message id -> view (DOM references and render cache)

const narrow = matchMedia("(max-width: 768px)");
const prefersDark = matchMedia("(prefers-color-scheme: dark)");

// ------------------------------------------------------------------ small helpers

function announce(text) {
  el.live.textContent = "";
  setTimeout(() => { el.live.textContent = text; }, 30);
}

function toast(text, { action, timeout = 4000, kind = "" } = {}) {
  const t = document.createElement("div");
  t.className = `toast ${kind}`;
  t.setAttribute("role", kind === "error" ? "alert" : "status");
  const span = document.createElement("span");
  span.textContent = text;
  t.append(span);
  let timer;
  const close = () => { clearTimeout(timer); t.remove(); };
  if (action) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "btn btn-small";
    b.textContent = action.label;
    b.addEventListener("click", () => { close(); action.run(); });
    t.append(b);
  }
  el.toasts.append(t);
  timer = setTimeout(close, timeout);
  return close;
}

async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    // Not a secure context (plain http on a LAN address): the old way still works.
    const ta = document.createElement("textarea");
    ta.value = text;
    ta.setAttribute("readonly", "");
    ta.style.cssText = "position:fixed;top:-1000px;opacity:0";
    document.body.append(ta);
    ta.select();
    let ok = false;
    try { ok = document.execCommand("copy"); } catch { ok = false; }
    ta.remove();
    return ok;
  }
}

function icon(name) {
  return `<svg viewBox="0 0 24 24" aria-hidden="true"><use href="#i-${name}"/></svg>`;
}

function button(action, label, iconName, { text = "", testid = "", cls = "icon-btn" } = {}) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = cls;
  b.dataset.action = action;
  b.setAttribute("aria-label", label);
  b.title = label;
  if (testid) b.dataset.testid = testid;
  b.innerHTML = icon(iconName) + (text ? `<span>${text}</span>` : "");
  return b;
}

function fmtRate(v) {
  if (!(typeof v === "number" && v > 0)) return "—";
  return v >= 10 ? String(Math.round(v)) : v.toFixed(1);
}

function fmtDate(ts) {
  const d = new Date(ts);
  const now = new Date();
  if (d.toDateString() === now.toDateString()) return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  const opts = d.getFullYear() === now.getFullYear() ? { month: "short", day: "numeric" } : { year: "numeric", month: "short", day: "numeric" };
  return d.toLocaleDateString([], opts);
}

function isCurrent(conv) { return state.current && conv && state.current.id === conv.id; }

// ------------------------------------------------------------------ theme

function savedTheme() {
  const t = lsGet(LS.theme);
  return t === "light" || t === "dark" ? t : "system";
}

function effectiveTheme() {
  const t = savedTheme();
  if (t !== "system") return t;
  return prefersDark.matches ? "dark" : "light";
}

function applyTheme() {
  const t = savedTheme();
  if (t === "system") delete document.documentElement.dataset.theme;
  else document.documentElement.dataset.theme = t;
  const next = effectiveTheme() === "dark" ? "light" : "dark";
  el.themeToggle.setAttribute("aria-label", `Switch to ${next} theme`);
  el.themeToggle.title = `Switch to ${next} theme`;
  document.documentElement.dataset.effectiveTheme = effectiveTheme();
}

function setTheme(t) {
  lsSet(LS.theme, t === "system" ? null : t);
  applyTheme();
}

// ------------------------------------------------------------------ sidebar / drawer

function drawerOpen() { return el.app.classList.contains("drawer-open"); }

function syncSidebarToggle() {
  const expanded = narrow.matches ? drawerOpen() : !el.app.classList.contains("sidebar-collapsed");
  el.sidebarToggle.setAttribute("aria-expanded", String(expanded));
  el.sidebarToggle.setAttribute("aria-label", expanded ? "Hide conversation list" : "Show conversation list");
}

function openDrawer() {
  el.app.classList.add("drawer-open");
  el.scrim.hidden = false;
  el.main.inert = true;
  syncSidebarToggle();
  const active = el.convList.querySelector('[aria-current="page"]');
  (active || el.newChat).focus();
}

function closeDrawer({ restoreFocus = true } = {}) {
  if (!drawerOpen()) return;
  const hadFocus = el.sidebar.contains(document.activeElement);
  el.app.classList.remove("drawer-open");
  el.scrim.hidden = true;
  el.main.inert = false;
  syncSidebarToggle();
  if (restoreFocus && hadFocus) el.sidebarToggle.focus();
}

function toggleSidebar() {
  if (narrow.matches) {
    if (drawerOpen()) closeDrawer(); else openDrawer();
  } else {
    const collapsed = el.app.classList.toggle("sidebar-collapsed");
    lsSet(LS.sidebar, collapsed ? "1" : null);
    syncSidebarToggle();
  }
}

function onLayoutChange() {
  if (!narrow.matches) {
    el.app.classList.remove("drawer-open");
    el.scrim.hidden = true;
    el.main.inert = false;
  }
  syncSidebarToggle();
}

// ------------------------------------------------------------------ conversation list

function matchesFilter(conv, q) {
  if (!q) return true;
  if ((conv.title || "").toLowerCase().includes(q)) return true;
  return conv.messages.some((m) => m.content.toLowerCase().includes(q));
}

function renderConvList() {
  const q = el.convFilter.value.trim().toLowerCase();
  const list = state.conversations.filter((c) => matchesFilter(c, q));
  const frag = document.createDocumentFragment();
  for (const conv of list) {
    const li = document.createElement("li");
    li.className = "conv-item";
    li.dataset.testid = "conversation-item";
    li.dataset.id = conv.id;
    const open = document.createElement("button");
    open.type = "button";
    open.className = "conv-open";
    open.dataset.action = "open";
    if (isCurrent(conv)) { open.setAttribute("aria-current", "page"); li.classList.add("active"); }
    const title = document.createElement("span");
    title.className = "conv-title";
    title.textContent = conv.title || "New chat";
    open.title = conv.title || "New chat";
    const date = document.createElement("span");
    date.className = "conv-date";
    date.textContent = fmtDate(conv.updatedAt || conv.createdAt);
    open.append(title, date);
    if (state.gen && state.gen.conv.id === conv.id) {
      const dot = document.createElement("span");
      dot.className = "conv-busy";
      dot.title = "Generating";
      dot.setAttribute("aria-label", "generating");
      open.append(dot);
    }
    const actions = document.createElement("div");
    actions.className = "conv-actions";
    const label = conv.title || "New chat";
    actions.append(
      button("rename", `Rename “${label}”`, "pencil", { testid: "conversation-rename" }),
      button("delete", `Delete “${label}”`, "trash", { testid: "conversation-delete" }),
    );
    li.append(open, actions);
    frag.append(li);
  }
  el.convList.replaceChildren(frag);
  el.convEmpty.hidden = list.length > 0;
  el.convEmpty.textContent = q ? "No matching conversations." : "No conversations yet.";
}

function startRename(li, conv) {
  const open = li.querySelector(".conv-open");
  const input = document.createElement("input");
  input.type = "text";
  input.className = "conv-rename";
  input.value = conv.title || "";
  input.setAttribute("aria-label", "Conversation title");
  input.dataset.testid = "conversation-rename-input";
  open.replaceWith(input);
  input.focus();
  input.select();
  let done = false;
  const finish = async (save) => {
    if (done) return;
    done = true;
    const title = input.value.trim();
    if (save && title && title !== conv.title) {
      conv.title = title;
      await persist(conv);
      if (isCurrent(conv)) document.title = `${title} · llamaserve`;
    }
    renderConvList();
    el.convList.querySelector(`li[data-id="${CSS.escape(conv.id)}"] .conv-open`)?.focus();
  };
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") { e.preventDefault(); finish(true); }
    else if (e.key === "Escape") { e.preventDefault(); e.stopPropagation(); finish(false); }
  });
  input.addEventListener("blur", () => finish(true));
}

async function removeConversation(conv) {
  if (state.gen && state.gen.conv.id === conv.id) state.gen.controller.abort();
  const idx = state.conversations.findIndex((c) => c.id === conv.id);
  if (idx >= 0) state.conversations.splice(idx, 1);
  const wasCurrent = isCurrent(conv);
  if (wasCurrent) newChat({ focus: false });
  await store.deleteConversation(conv.id);
  renderConvList();
  // Keep keyboard focus in the list: on the item now at that place, else on "New chat".
  const next = el.convList.querySelectorAll(".conv-open")[Math.max(0, Math.min(idx, state.conversations.length - 1))];
  if (el.sidebar.contains(document.activeElement) || document.activeElement === document.body) (next || el.newChat).focus();
  toast(`Deleted “${conv.title || "New chat"}”`, {
    timeout: 6000,
    action: {
      label: "Undo",
      run: async () => {
        await store.saveConversation(conv);
        state.conversations.push(conv);
        sortConversations();
        renderConvList();
        if (wasCurrent) openConversation(conv);
      },
    },
  });
}

function sortConversations() {
  state.conversations.sort((a, b) => (b.updatedAt || 0) - (a.updatedAt || 0));
}

async function persist(conv) {
  if (!state.conversations.includes(conv)) return;  // deleted meanwhile (e.g. while it streamed)
  try {
    await store.saveConversation(conv);
  } catch (err) {
    console.error("save failed", err);
    toast(`Could not save the conversation: ${err.message || err}`, { kind: "error" });
  }
}

// ------------------------------------------------------------------ opening conversations

function openConversation(conv, { focus = true } = {}) {
  state.current = conv;
  state.editing = null;
  lsSet(LS.current, conv.id);
  document.title = `${conv.title || "New chat"} · llamaserve`;
  renderConversation();
  renderConvList();
  state.stick = true;
  scrollToBottom(true);
  if (narrow.matches) closeDrawer({ restoreFocus: false });
  if (focus) el.input.focus();
}

function newChat({ focus = true } = {}) {
  state.current = null;
  state.editing = null;
  lsSet(LS.current, null);
  document.title = "llamaserve";
  renderConversation();
  renderConvList();
  if (narrow.matches) closeDrawer({ restoreFocus: false });
  if (focus) el.input.focus();
}

// ------------------------------------------------------------------ messages

function renderConversation() {
  views.clear();
  el.messages.replaceChildren();
  const msgs = state.current ? state.current.messages : [];
  for (const m of msgs) el.messages.append(createMessageView(m).root);
  for (const m of msgs) updateMessage(m);
  el.empty.hidden = msgs.length > 0;
  el.messages.hidden = msgs.length === 0;
}

function createMessageView(msg) {
  const root = document.createElement("article");
  root.className = `msg msg-${msg.role}`;
  root.dataset.testid = "message";
  root.dataset.role = msg.role;
  root.dataset.id = msg.id;
  root.setAttribute("aria-label", msg.role === "user" ? "You said" : "Assistant said");

  const body = document.createElement("div");
  body.className = "msg-body";
  const v = { root, body, msg, cache: {} };

  if (msg.role === "assistant") {
    const details = document.createElement("details");
    details.className = "thinking";
    details.dataset.testid = "message-reasoning";
    details.hidden = true;
    const summary = document.createElement("summary");
    const label = document.createElement("span");
    label.className = "thinking-label";
    summary.append(label);
    const tbody = document.createElement("div");
    tbody.className = "thinking-body md";
    details.append(summary, tbody);
    summary.addEventListener("click", () => { v.userToggled = true; });
    v.details = details; v.thinkingLabel = label; v.thinkingBody = tbody;

    const tools = document.createElement("div");
    tools.className = "tool-calls";
    tools.dataset.testid = "message-tool-calls";
    tools.hidden = true;
    v.tools = tools;
    body.append(details);
  }

  if (msg.role === "user" && msg.attachments?.length) body.append(attachmentsView(msg.attachments));

  const content = document.createElement("div");
  content.className = msg.role === "assistant" ? "msg-content md" : "msg-content plain";
  content.dataset.testid = "message-content";
  body.append(content);
  v.content = content;
  if (v.tools) body.append(v.tools);

  const error = document.createElement("div");
  error.className = "msg-error";
  error.dataset.testid = "message-error";
  error.hidden = true;
  body.append(error);
  v.error = error;

  const footer = document.createElement("div");
  footer.className = "msg-footer";
  const meta = document.createElement("span");
  meta.className = "msg-meta";
  meta.dataset.testid = "message-timings";
  const actions = document.createElement("div");
  actions.className = "msg-actions";
  footer.append(meta, actions);
  v.meta = meta; v.actions = actions;

  root.append(body, footer);
  views.set(msg.id, v);
  return v;
}

function isLastAssistant(msg) {
  const msgs = state.current?.messages || [];
  return msgs.length > 0 && msgs[msgs.length - 1].id === msg.id && msg.role === "assistant";
}

function renderActions(v) {
  const msg = v.msg;
  const busy = !!state.gen;
  const key = `${busy}|${isLastAssistant(msg)}|${state.editing === msg.id}`;
  if (v.cache.actions === key) return;
  v.cache.actions = key;
  const list = [];
  if (state.editing === msg.id) { v.actions.replaceChildren(); return; }
  if (msg.role === "user") {
    const edit = button("edit", "Edit message", "edit", { testid: "edit-message" });
    edit.disabled = busy;
    list.push(edit, button("copy", "Copy message", "copy", { testid: "copy-message" }));
  } else {
    list.push(button("copy", "Copy answer", "copy", { testid: "copy-message" }));
    if (isLastAssistant(msg)) {
      const regen = button("regenerate", "Regenerate answer", "refresh", { testid: "regenerate" });
      regen.disabled = busy;
      list.push(regen);
    }
  }
  v.actions.replaceChildren(...list);
}

function refreshAllActions() {
  for (const v of views.values()) renderActions(v);
}

function thinkingSeconds(msg) {
  return typeof msg.reasoningMs === "number" ? (msg.reasoningMs / 1000).toFixed(1) : null;
}

function updateMessage(msg) {
  const v = views.get(msg.id);
  if (!v) return;
  const streaming = !!(state.gen && state.gen.msg?.id === msg.id);
  v.root.setAttribute("aria-busy", String(streaming));
  v.root.classList.toggle("streaming", streaming);

  if (msg.role === "user") {
    if (state.editing !== msg.id && v.cache.content !== msg.content) {
      v.cache.content = msg.content;
      v.content.textContent = msg.content;
    }
  } else {
    let reasoning = msg.reasoning || "";
    let content = msg.content || "";
    let thinkingOpen = streaming && !content;
    if (!reasoning) {
      const split = splitThink(content);
      if (split.reasoning || split.open) {
        reasoning = split.reasoning;
        content = split.content;
        thinkingOpen = streaming && split.open;
      }
    }
    const hasReasoning = !!reasoning;
    v.details.hidden = !hasReasoning;
    if (hasReasoning) {
      const secs = thinkingSeconds(msg);
      const label = thinkingOpen ? "Thinking…" : secs ? `Thought for ${secs} s` : "Thinking";
      if (v.thinkingLabel.textContent !== label) v.thinkingLabel.textContent = label;
      v.details.classList.toggle("active", thinkingOpen);
      if (v.cache.reasoning !== reasoning) {
        v.cache.reasoning = reasoning;
        v.thinkingBody.innerHTML = renderMarkdown(reasoning);
      }
      if (!v.userToggled && streaming) v.details.open = thinkingOpen;
    }
    if (v.cache.content !== content) {
      v.cache.content = content;
      v.content.innerHTML = renderMarkdown(content);
    }
    const waiting = streaming && !content && !hasReasoning && !(msg.toolCalls && msg.toolCalls.length);
    v.content.classList.toggle("waiting", waiting);
    if (waiting && !v.content.firstChild) {
      v.content.innerHTML = '<span class="dots" aria-hidden="true"><span></span><span></span><span></span></span>';
      v.cache.content = null;
    }
    v.content.hidden = !content && !waiting;
    renderToolCalls(v, msg);
  }

  v.error.hidden = !msg.error;
  if (msg.error) v.error.textContent = msg.error;

  v.meta.textContent = metaText(msg, streaming);
  v.meta.title = metaTitle(msg);
  renderActions(v);
}

function renderToolCalls(v, msg) {
  const calls = (msg.toolCalls || []).filter(Boolean);
  const key = JSON.stringify([calls, msg.repeated || false]);
  if (v.cache.tools === key) return;
  v.cache.tools = key;
  v.tools.hidden = calls.length === 0;
  v.openResults = v.openResults || new Set();
  const frag = document.createDocumentFragment();
  calls.forEach((call, i) => {
    const box = document.createElement("div");
    box.className = "tool-call";
    box.dataset.testid = "tool-call";
    box.dataset.tool = call.function?.name || "";
    const state_ = call.result?.status || (msg.repeated ? "repeated" : "");
    if (state_) box.dataset.status = state_;
    const head = document.createElement("div");
    head.className = "tool-call-head";
    head.innerHTML = icon("tool");
    const name = document.createElement("span");
    name.className = "tool-call-name";
    name.textContent = call.function?.name || "(tool)";
    const kind = document.createElement("span");
    kind.className = "tool-call-kind";
    kind.textContent = "tool call";
    head.append(kind, name);
    const status = document.createElement("span");
    status.className = "tool-call-status";
    status.dataset.testid = "tool-call-status";
    status.textContent = {
      pending: "waiting for your approval", running: "running…", done: "done", error: "failed",
      denied: "denied", stopped: "stopped", repeated: "repeated an earlier call: asked for an answer instead",
    }[state_] || "";
    head.append(status);
    const pre = document.createElement("pre");
    pre.tabIndex = 0;
    const code = document.createElement("code");
    let args = call.function?.arguments || "";
    try { args = JSON.stringify(JSON.parse(args), null, 2); } catch { /* partial JSON while streaming */ }
    code.textContent = args;
    pre.append(code);
    box.append(head, pre);
    if (call.result?.status === "pending") box.append(approvalBar(msg, i, call));
    if (call.result && call.result.status !== "pending") {
      const details = document.createElement("details");
      details.className = "tool-result";
      details.dataset.testid = "tool-result";
      details.open = call.result.status === "running" || v.openResults.has(i);
      details.addEventListener("toggle", () => {
        if (details.open) v.openResults.add(i); else v.openResults.delete(i);
      });
      const summary = document.createElement("summary");
      summary.textContent = call.result.status === "running" ? "Output (running)" : "Result";
      const out = document.createElement("pre");
      out.tabIndex = 0;
      const outCode = document.createElement("code");
      outCode.dataset.testid = "tool-result-text";
      outCode.textContent = call.result.text || "";
      out.append(outCode);
      details.append(summary, out);
      box.append(details);
    }
    frag.append(box);
  });
  v.tools.replaceChildren(frag);
}

function approvalBar(msg, index, call) {
  const bar = document.createElement("div");
  bar.className = "tool-approval";
  bar.setAttribute("role", "group");
  bar.setAttribute("aria-label", `Run ${call.function?.name || "this tool"}?`);
  const text = document.createElement("span");
  text.textContent = "This tool can change files or run commands. Run it?";
  const decide = (decision) => approvals.get(`${msg.id}:${index}`)?.(decision);
  const mk = (label, decision, testid, cls) => {
    const b = document.createElement("button");
    b.type = "button";
    b.className = cls;
    b.textContent = label;
    b.dataset.testid = testid;
    b.addEventListener("click", () => decide(decision));
    return b;
  };
  bar.append(
    text,
    mk("Allow", "once", "tool-allow", "btn btn-primary btn-small"),
    mk("Allow for this chat", "chat", "tool-allow-chat", "btn btn-small"),
    mk("Deny", "deny", "tool-deny", "btn btn-small"),
  );
  return bar;
}

function metaText(msg, streaming) {
  if (msg.role !== "assistant") return "";
  const parts = [];
  const t = msg.timings;
  if (t) {
    parts.push(`prompt ${fmtRate(t.prompt_per_second)} t/s`);
    parts.push(`gen ${fmtRate(t.predicted_per_second)} t/s`);
    parts.push(`cached ${t.cache_n ?? 0}`);
  }
  if (msg.stopped) parts.push("stopped");
  else if (msg.finishReason === "length") parts.push("length limit");
  if (streaming && !t) return "";
  return parts.join(" · ");
}

function metaTitle(msg) {
  const t = msg.timings;
  if (!t) return "";
  const lines = [
    `Prompt: ${t.prompt_n ?? "?"} tokens in ${Math.round(t.prompt_ms ?? 0)} ms`,
    `Generation: ${t.predicted_n ?? "?"} tokens in ${Math.round(t.predicted_ms ?? 0)} ms`,
    `Reused from cache: ${t.cache_n ?? 0} tokens`,
  ];
  const used = (t.cache_n || 0) + (t.prompt_n || 0) + (t.predicted_n || 0);
  if (used && state.nCtx) lines.push(`Context: ${used} / ${state.nCtx} tokens`);
  if (msg.model) lines.push(`Model: ${msg.model}`);
  return lines.join("\n");
}

// One render per frame while tokens stream. The timer backs up the frame: a page that
// produces no frames (a background tab, some headless browsers) still shows a finished
// call or turn. A render asked for another message first flushes the pending one.
let pendingUpdate = null;
function scheduleUpdate(msg) {
  if (pendingUpdate?.msg === msg) return;
  flushUpdate();
  pendingUpdate = { msg, frame: requestAnimationFrame(flushUpdate), timer: setTimeout(flushUpdate, 200) };
}

function flushUpdate() {
  if (!pendingUpdate) return;
  const { msg, frame, timer } = pendingUpdate;
  pendingUpdate = null;
  cancelAnimationFrame(frame);
  clearTimeout(timer);
  updateMessage(msg);
  if (state.stick) scrollToBottom();
}

function scrollToBottom(force = false) {
  if (force) state.stick = true;
  el.scroller.scrollTop = el.scroller.scrollHeight;
  el.jump.hidden = true;
}

function onScroll() {
  const gap = el.scroller.scrollHeight - el.scroller.scrollTop - el.scroller.clientHeight;
  state.stick = gap < 48;
  el.jump.hidden = state.stick || el.messages.hidden;
}

// ------------------------------------------------------------------ sending and streaming

function setGenerating(on) {
  const stopHadFocus = document.activeElement === el.stop;
  el.app.dataset.generating = String(on);
  el.stop.hidden = !on;
  el.send.hidden = on;
  updateSendState();
  refreshAllActions();
  if (!on && stopHadFocus) el.input.focus();
}

function updateSendState() {
  el.send.disabled = (!el.input.value.trim() && !state.pending.length) || !!state.gen;
}

// ------------------------------------------------------------------ attachments

function attachmentsView(items) {
  const box = document.createElement("div");
  box.className = "msg-attachments";
  for (const a of items) {
    const node = a.kind === "image" ? document.createElement("img") : document.createElement("audio");
    if (a.kind === "image") node.alt = a.name || "image";
    else node.controls = true;
    node.src = a.url;
    node.dataset.testid = "message-attachment";
    node.title = a.name || "";
    box.append(node);
  }
  return box;
}

function audioFormat(a) {
  const m = (a.mime || "").toLowerCase();
  if (m.includes("mpeg") || m.includes("mp3") || /\.mp3$/i.test(a.name || "")) return "mp3";
  return "wav";
}

function syncAttach() {
  const { vision, audio } = state.modalities;
  el.attach.hidden = !(vision || audio);
  const accept = [];
  if (vision) accept.push("image/*");
  if (audio) accept.push("audio/wav", "audio/x-wav", "audio/mpeg", ".wav", ".mp3");
  el.attachFile.accept = accept.join(",");
}

function kindOf(file) {
  const type = (file.type || "").toLowerCase();
  if (type.startsWith("image/")) return "image";
  if (type.startsWith("audio/") || /\.(wav|mp3)$/i.test(file.name || "")) return "audio";
  return "";
}

function readAsDataURL(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result));
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function addFiles(files) {
  for (const file of files) {
    const kind = kindOf(file);
    const ok = (kind === "image" && state.modalities.vision) || (kind === "audio" && state.modalities.audio);
    if (!ok) {
      toast(`This model does not accept ${kind || "this kind of"} files (${file.name || "pasted data"})`, { kind: "error" });
      continue;
    }
    try {
      state.pending.push({ kind, name: file.name || kind, mime: file.type, url: await readAsDataURL(file) });
    } catch {
      toast(`Could not read ${file.name || "the file"}`, { kind: "error" });
    }
  }
  renderPending();
}

function renderPending() {
  el.attachments.replaceChildren();
  state.pending.forEach((a, i) => {
    const item = document.createElement("div");
    item.className = "attachment";
    item.dataset.testid = "attachment";
    if (a.kind === "image") {
      const img = document.createElement("img");
      img.src = a.url;
      img.alt = a.name;
      item.append(img);
    }
    const name = document.createElement("span");
    name.className = "att-name";
    name.textContent = a.name;
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "att-remove";
    remove.textContent = "×";
    remove.setAttribute("aria-label", `Remove ${a.name}`);
    remove.dataset.testid = "attachment-remove";
    remove.addEventListener("click", () => { state.pending.splice(i, 1); renderPending(); });
    item.append(name, remove);
    el.attachments.append(item);
  });
  el.attachments.hidden = !state.pending.length;
  updateSendState();
}

function userContent(m) {
  if (!m.attachments?.length) return m.content;
  const parts = [];
  if (m.content) parts.push({ type: "text", text: m.content });
  for (const a of m.attachments) {
    if (a.kind === "image") parts.push({ type: "image_url", image_url: { url: a.url } });
    else parts.push({ type: "input_audio", input_audio: { data: a.url.slice(a.url.indexOf(",") + 1), format: audioFormat(a) } });
  }
  return parts;
}

function autosize() {
  el.input.style.height = "auto";
  el.input.style.height = `${Math.min(el.input.scrollHeight, Math.round(window.innerHeight * 0.4))}px`;
}

function buildBody(history, { toolChoiceNone = false } = {}) {
  const s = settings.current();
  const messages = [];
  if (s.system_prompt && s.system_prompt.trim()) messages.push({ role: "system", content: s.system_prompt });
  for (const m of history) {
    if (m.role === "assistant") {
      if (m.repeated) continue;  // a call it had made already: left out, the answer was asked for instead
      const text = splitThink(m.content || "").content;
      const calls = (m.toolCalls || []).filter((c) => c && c.result && c.result.status !== "pending");
      if (!text && !calls.length) continue;  // failed or stopped before any text
      const out = { role: "assistant", content: text };
      if (calls.length) {
        out.tool_calls = calls.map((c) => ({ id: c.id, type: "function", function: { name: c.function.name, arguments: c.function.arguments } }));
      }
      messages.push(out);
      for (const c of calls) messages.push({ role: "tool", tool_call_id: c.id, content: c.result.text || "" });
    } else {
      messages.push({ role: "user", content: userContent(m) });
    }
  }
  const body = { messages, stream: true, ...settings.requestParams(s) };
  const offered = enabledTools();
  if (offered.length) {
    body.tools = offered.map((t) => t.definition);
    if (toolChoiceNone) body.tool_choice = "none";
  }
  const model = state.model || state.models[0] || "";
  if (model) body.model = model;
  return body;
}

function applyChunk(msg, chunk, clock) {
  if (chunk.model && !msg.model) msg.model = chunk.model;
  if (chunk.timings) msg.timings = chunk.timings;
  const choice = chunk.choices?.[0];
  if (!choice) return;
  const d = choice.delta || {};
  if (typeof d.reasoning_content === "string" && d.reasoning_content) {
    if (!clock.reasoningStart) clock.reasoningStart = performance.now();
    msg.reasoning = (msg.reasoning || "") + d.reasoning_content;
  }
  const answered = (typeof d.content === "string" && d.content) || (Array.isArray(d.tool_calls) && d.tool_calls.length);
  if (answered && clock.reasoningStart && msg.reasoningMs === undefined) {
    msg.reasoningMs = Math.round(performance.now() - clock.reasoningStart);
  }
  if (typeof d.content === "string" && d.content) msg.content += d.content;
  if (Array.isArray(d.tool_calls)) mergeToolCalls(msg, d.tool_calls);
  if (choice.finish_reason) msg.finishReason = choice.finish_reason;
}

function mergeToolCalls(msg, deltas) {
  msg.toolCalls = msg.toolCalls || [];
  deltas.forEach((tc, i) => {
    const idx = Number.isInteger(tc.index) ? tc.index : i;
    const cur = msg.toolCalls[idx] || (msg.toolCalls[idx] = { id: "", type: "function", function: { name: "", arguments: "" } });
    if (tc.id) cur.id = tc.id;
    if (tc.type) cur.type = tc.type;
    const fn = tc.function || {};
    if (fn.name) cur.function.name = cur.function.name ? cur.function.name + fn.name : fn.name;
    if (typeof fn.arguments === "string") cur.function.arguments += fn.arguments;
    else if (fn.arguments && typeof fn.arguments === "object") cur.function.arguments = JSON.stringify(fn.arguments);
  });
}

async function sendMessage(text) {
  text = text.trim();
  if ((!text && !state.pending.length) || state.gen) return;
  const attachments = state.pending.splice(0);
  let conv = state.current;
  const now = Date.now();
  if (!conv) {
    conv = { id: store.newId(), title: "", createdAt: now, updatedAt: now, messages: [] };
    state.current = conv;
    state.conversations.unshift(conv);
    lsSet(LS.current, conv.id);
  }
  const userMsg = { id: store.newId(), role: "user", content: text, createdAt: now };
  if (attachments.length) userMsg.attachments = attachments;
  conv.messages.push(userMsg);
  renderPending();
  if (!conv.title) conv.title = store.titleFrom(conv.messages);
  conv.updatedAt = now;
  document.title = `${conv.title} · llamaserve`;
  el.input.value = "";
  autosize();
  updateSendState();
  renderConversation();
  scrollToBottom(true);
  await generate(conv);
}

/**
 * Answer the conversation's last message. With tools on, this is the agent loop: a turn that
 * ends in tool calls runs them (asking first for a tool that writes or executes, unless
 * allowed for this chat), then the next turn reads their results; Stop ends it all.
 */
async function generate(conv) {
  const controller = new AbortController();
  state.gen = { controller, conv, msg: null };
  setGenerating(true);
  let toolChoiceNone = false;
  let msg = null;
  for (let step = 0; ; step++) {
    msg = await streamTurn(conv, controller, { toolChoiceNone });
    toolChoiceNone = false;
    const calls = (msg.toolCalls || []).filter(Boolean);
    if (msg.stopped || msg.error || !calls.length || !enabledTools().length) break;
    if (step >= MAX_TOOL_STEPS) {
      msg.error = `Stopped after ${MAX_TOOL_STEPS} tool-calling turns in a row.`;
      break;
    }
    if (repeatsEarlierCalls(conv, msg)) {
      // A small model can ask again for what it was just given: the next turn may not call tools.
      msg.repeated = true;
      toolChoiceNone = true;
      if (isCurrent(conv)) updateMessage(msg);
      continue;
    }
    await runToolCalls(conv, msg, controller);
    if (controller.signal.aborted) { msg.stopped = true; break; }
  }
  state.gen = null;
  conv.updatedAt = Date.now();
  setGenerating(false);
  if (isCurrent(conv)) {
    updateMessage(msg);
    if (state.stick) scrollToBottom();
  }
  await persist(conv);
  renderConvList();
  announce(msg.error ? `Error: ${msg.error}` : msg.stopped ? "Stopped." : "Answer complete.");
}

/** Every call of `msg` was made, with the same arguments, since the user last wrote. */
function repeatsEarlierCalls(conv, msg) {
  const done = new Set();
  for (let i = conv.messages.length - 2; i >= 0 && conv.messages[i].role !== "user"; i--) {
    for (const c of conv.messages[i].toolCalls || []) if (c?.result && !conv.messages[i].repeated) done.add(agent.callKey(c));
  }
  return (msg.toolCalls || []).every((c) => c && done.has(agent.callKey(c)));
}

async function runToolCalls(conv, msg, controller) {
  const redraw = () => { if (isCurrent(conv)) scheduleUpdate(msg); };
  conv.allowedTools = conv.allowedTools || [];
  const calls = msg.toolCalls.filter(Boolean);
  for (let i = 0; i < calls.length; i++) {
    const call = calls[i];
    if (!call.id) call.id = `call_${store.newId()}`;
    const name = call.function?.name || "";
    const tool = enabledTools().find((t) => t.tool === name);
    if (controller.signal.aborted) { call.result = { status: "stopped", text: "Stopped by the user." }; continue; }
    if (!tool) {
      const off = state.tools.some((t) => t.tool === name);
      call.result = { status: "error", text: off ? `Error: the user has switched the tool "${name}" off.` : `Error: there is no tool named "${name}".` };
      redraw();
      continue;
    }
    if (agent.needsApproval(tool) && !conv.allowedTools.includes(name)) {
      call.result = { status: "pending", text: "" };
      redraw();
      announce(`The model wants to run ${name}. Allow or deny it.`);
      const decision = await askApproval(msg, i, controller.signal);
      if (decision === "chat") { conv.allowedTools.push(name); }
      if (decision === "deny") { call.result = { status: "denied", text: "The user denied this tool call." }; redraw(); continue; }
      if (decision === "stop") { call.result = { status: "stopped", text: "Stopped by the user." }; redraw(); continue; }
    }
    call.result = { status: "running", text: "" };
    redraw();
    try {
      const out = await agent.runTool(call, {
        signal: controller.signal,
        onChunk(text) { call.result.text = text; redraw(); },
      });
      call.result = { status: out.error ? "error" : "done", text: out.text };
    } catch (err) {
      if (controller.signal.aborted || err?.name === "AbortError") call.result = { status: "stopped", text: call.result.text + "\n[stopped by the user]" };
      else call.result = { status: "error", text: `Error: ${err?.message || err}` };
    }
    redraw();
    persist(conv);
  }
}

function askApproval(msg, index, signal) {
  const id = `${msg.id}:${index}`;
  return new Promise((resolve) => {
    const done = (decision) => { approvals.delete(id); signal.removeEventListener("abort", onAbort); resolve(decision); };
    const onAbort = () => done("stop");
    signal.addEventListener("abort", onAbort);
    approvals.set(id, done);
  });
}

/** One model turn: a new assistant message, streamed. */
async function streamTurn(conv, controller, { toolChoiceNone = false } = {}) {
  const msg = { id: store.newId(), role: "assistant", content: "", createdAt: Date.now() };
  conv.messages.push(msg);
  conv.updatedAt = Date.now();
  sortConversations();
  state.gen.msg = msg;
  if (isCurrent(conv)) {
    el.empty.hidden = true;
    el.messages.hidden = false;
    el.messages.append(createMessageView(msg).root);
    updateMessage(msg);
    scrollToBottom(true);
  }
  refreshAllActions();
  renderConvList();
  announce("Generating an answer. Press Escape to stop.");
  persist(conv);

  const body = buildBody(conv.messages.slice(0, -1), { toolChoiceNone });
  const clock = {};
  let lastSave = Date.now();
  try {
    await api.streamChat(body, {
      signal: controller.signal,
      onChunk(chunk) {
        applyChunk(msg, chunk, clock);
        if (isCurrent(conv)) scheduleUpdate(msg);
        if (Date.now() - lastSave > 1000) { lastSave = Date.now(); persist(conv); }
      },
    });
  } catch (err) {
    if (controller.signal.aborted || err?.name === "AbortError") msg.stopped = true;
    else msg.error = err?.message || String(err);
  }
  if (clock.reasoningStart && msg.reasoningMs === undefined) msg.reasoningMs = Math.round(performance.now() - clock.reasoningStart);
  flushUpdate();
  if (isCurrent(conv)) updateMessage(msg);
  return msg;
}

function stopGeneration() {
  if (state.gen) state.gen.controller.abort();
}

function regenerate() {
  const conv = state.current;
  if (!conv || state.gen) return;
  let idx = conv.messages.length - 1;
  if (idx < 0) return;
  if (conv.messages[idx].role === "assistant") conv.messages.splice(idx, 1);
  renderConversation();
  el.input.focus();  // the button that had focus is gone
  generate(conv);
}

// ------------------------------------------------------------------ editing a user message

function startEdit(msg) {
  if (state.gen) return;
  if (state.editing) cancelEdit();
  state.editing = msg.id;
  const v = views.get(msg.id);
  const box = document.createElement("div");
  box.className = "edit-box";
  const label = document.createElement("label");
  label.className = "visually-hidden";
  label.htmlFor = `edit-${msg.id}`;
  label.textContent = "Edit message";
  const ta = document.createElement("textarea");
  ta.id = `edit-${msg.id}`;
  ta.className = "edit-input";
  ta.dataset.testid = "edit-input";
  ta.value = msg.content;
  ta.rows = Math.min(12, Math.max(2, msg.content.split("\n").length));
  const row = document.createElement("div");
  row.className = "edit-actions";
  const hint = document.createElement("span");
  hint.className = "edit-hint";
  hint.textContent = "Enter to send · Escape to cancel";
  const cancel = document.createElement("button");
  cancel.type = "button";
  cancel.className = "btn";
  cancel.dataset.action = "edit-cancel";
  cancel.dataset.testid = "edit-cancel";
  cancel.textContent = "Cancel";
  const save = document.createElement("button");
  save.type = "button";
  save.className = "btn btn-primary";
  save.dataset.action = "edit-save";
  save.dataset.testid = "edit-save";
  save.textContent = "Send";
  row.append(hint, cancel, save);
  box.append(label, ta, row);
  v.content.replaceWith(box);
  v.editBox = box;
  v.root.classList.add("editing");
  renderActions(v);
  ta.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); saveEdit(msg, ta.value); }
    else if (e.key === "Escape") { e.preventDefault(); e.stopPropagation(); cancelEdit(); }
  });
  ta.focus();
  ta.setSelectionRange(ta.value.length, ta.value.length);
}

function cancelEdit() {
  const id = state.editing;
  state.editing = null;
  const v = id && views.get(id);
  if (!v || !v.editBox) return;
  v.editBox.replaceWith(v.content);
  v.editBox = null;
  v.root.classList.remove("editing");
  updateMessage(v.msg);
  v.actions.querySelector('[data-action="edit"]')?.focus();
}

function saveEdit(msg, text) {
  const conv = state.current;
  text = text.trim();
  if (!conv || !text || state.gen) return;
  const idx = conv.messages.findIndex((m) => m.id === msg.id);
  if (idx < 0) return;
  state.editing = null;
  msg.content = text;
  conv.messages.splice(idx + 1);
  if (idx === conv.messages.findIndex((m) => m.role === "user")) conv.title = store.titleFrom(conv.messages) || conv.title;
  renderConversation();
  el.input.focus();
  generate(conv);
}

// ------------------------------------------------------------------ server info

async function loadServerInfo() {
  el.app.dataset.server = "loading";
  const [props, models] = await Promise.allSettled([api.getJSON("/props"), api.getJSON("/v1/models")]);
  let problem = null;

  if (models.status === "fulfilled") {
    const data = Array.isArray(models.value?.data) ? models.value.data : [];
    state.models = data.map((m) => String(m.id)).filter(Boolean);
    // A router lists each model's state (loaded, loading, unloaded, failed with its reason).
    state.modelStatus = Object.fromEntries(data.filter((m) => m.status).map((m) => [String(m.id), m.status]));
  } else {
    problem = models.reason;
  }

  if (props.status === "fulfilled") {
    const p = props.value || {};
    const dgs = p.default_generation_settings || {};
    settings.setServerDefaults(p.ui_settings, dgs.params);
    const uiTheme = p.ui_settings?.theme;
    if ((uiTheme === "light" || uiTheme === "dark") && !lsGet(LS.theme)) {
      document.documentElement.dataset.theme = uiTheme;
      document.documentElement.dataset.effectiveTheme = uiTheme;
    }
    state.router = p.role === "router";
    state.modelName = state.router
      ? ""
      : p.model_alias || (p.model_path ? String(p.model_path).split(/[\\/]/).pop() : "") || state.models[0] || "";
    state.nCtx = Number(dgs.n_ctx) || 0;
    const mod = p.modalities || {};
    state.modalities = { vision: !!mod.vision, audio: !!mod.audio };
    syncAttach();
  } else {
    problem = props.reason;
    if (!state.modelName) state.modelName = state.models[0] || "";
  }

  renderModelInfo();
  state.tools = await agent.loadTools();
  el.app.dataset.tools = String(state.tools.length);
  if (problem && props.status === "rejected") {
    el.app.dataset.server = "error";
    const msg = problem instanceof api.ApiError ? problem.message : "The server could not be reached.";
    el.bannerText.textContent = msg;
    el.banner.hidden = false;
  } else {
    el.app.dataset.server = "ok";
    el.banner.hidden = true;
  }
}

function statusLabel(status) {
  if (!status) return "";
  if (status.failed) return `failed (exit code ${status.exit_code})`;
  return status.value || "";
}

function renderModelInfo() {
  const many = state.models.length > 1 || (state.router && state.models.length > 0);
  if (many) {
    if (!state.models.includes(state.model)) state.model = state.models.includes(state.modelName) ? state.modelName : state.models[0];
    el.modelSelect.replaceChildren(...state.models.map((id) => {
      const o = document.createElement("option");
      const label = statusLabel(state.modelStatus?.[id]);
      o.value = id;
      o.textContent = label ? `${id} · ${label}` : id;
      const tail = state.modelStatus?.[id]?.log_tail;
      if (Array.isArray(tail) && tail.length) o.title = tail.slice(-3).join("\n");
      return o;
    }));
    el.modelSelect.value = state.model;
  } else {
    state.model = state.models[0] || "";
  }
  if (state.router) state.modelName = state.model;
  el.modelSelect.hidden = !many;
  el.modelName.hidden = many;
  el.modelName.textContent = state.modelName || "No model";
  el.modelName.title = state.modelName ? `Model: ${state.modelName}` : "";
  if (state.nCtx) {
    el.ctxSize.hidden = false;
    el.ctxSize.textContent = `ctx ${state.nCtx.toLocaleString("en-US")}`;
    el.ctxSize.title = `Context size: ${state.nCtx} tokens per slot`;
  } else {
    el.ctxSize.hidden = true;
  }
  el.emptySub.textContent = state.modelName
    ? `Chatting with ${state.modelName}. Messages stay in this browser.`
    : "Messages stay in this browser.";
}

async function refreshModelStatus() {
  try {
    const listing = await api.getJSON("/v1/models");
    const data = Array.isArray(listing?.data) ? listing.data : [];
    state.modelStatus = Object.fromEntries(data.filter((m) => m.status).map((m) => [String(m.id), m.status]));
  } catch { /* keep the last states */ }
}

async function onModelChange() {
  state.model = el.modelSelect.value;
  lsSet(LS.model, state.model);
  if (state.router) {
    state.modelStatus = { ...state.modelStatus, [state.model]: { value: "loading" } };
    renderModelInfo();
  }
  try {
    // On a router this loads the model (and waits for it).
    const p = await api.getJSON(`/props?model=${encodeURIComponent(state.model)}`);
    const n = Number(p?.default_generation_settings?.n_ctx);
    if (n) state.nCtx = n;
  } catch (err) {
    // A single-model server ignores ?model= or refuses it: keep what we have. A router says why a load failed.
    if (state.router) toast(`Could not load ${state.model}: ${err.message || err}`, { kind: "error", timeout: 8000 });
  }
  if (state.router) await refreshModelStatus();
  renderModelInfo();
  announce(`Model ${state.model} selected.`);
}

// ------------------------------------------------------------------ dialogs

function promptForKey(reason) {
  return new Promise((resolve) => {
    const dlg = el.keyDialog;
    const returnFocus = document.activeElement;
    el.keyMessage.textContent = `${reason} Enter it to continue; it is kept in this browser.`;
    el.keyInput.value = "";
    dlg.returnValue = "";
    const onClose = () => {
      dlg.removeEventListener("close", onClose);
      const key = dlg.returnValue === "save" ? el.keyInput.value.trim() : "";
      if (key) api.setApiKey(key);
      if (returnFocus && document.contains(returnFocus)) returnFocus.focus?.();
      resolve(key || null);
    };
    dlg.addEventListener("close", onClose);
    dlg.showModal();
    el.keyInput.focus();
  });
}

function openSettings() {
  const form = el.settingsForm;
  settings.toForm(form, settings.current());
  form.elements.theme.value = savedTheme();
  form.elements.api_key.value = api.getApiKey();
  renderToolToggles();
  el.settingsError.hidden = true;
  el.settingsDialog.returnValue = "";
  el.settingsDialog.showModal();
  form.elements.system_prompt.focus();
}

function renderToolToggles() {
  el.toolsFieldset.hidden = state.tools.length === 0;
  const on = new Set(enabledTools().map((t) => t.tool));
  el.toolToggles.replaceChildren(...state.tools.map((t) => {
    const label = document.createElement("label");
    label.className = "tool-toggle";
    const box = document.createElement("input");
    box.type = "checkbox";
    box.value = t.tool;
    box.checked = on.has(t.tool);
    box.dataset.testid = `tool-toggle-${t.tool}`;
    const name = document.createElement("span");
    name.textContent = t.tool + (t.permissions?.write ? " (asks first)" : "");
    name.title = t.definition?.function?.description || "";
    label.append(box, name);
    return label;
  }));
}

function onSettingsSubmit(e) {
  const action = e.submitter?.value;
  if (action !== "save") return;
  const form = el.settingsForm;
  const r = settings.fromForm(form);
  if (r.error) {
    e.preventDefault();
    el.settingsError.textContent = r.error;
    el.settingsError.hidden = false;
    r.field.setAttribute("aria-invalid", "true");
    r.field.focus();
    return;
  }
  for (const f of form.querySelectorAll("[aria-invalid]")) f.removeAttribute("aria-invalid");
  settings.save(r.values);
  setTheme(form.elements.theme.value);
  api.setApiKey(form.elements.api_key.value.trim());
  const off = [...el.toolToggles.querySelectorAll("input[type=checkbox]")].filter((c) => !c.checked).map((c) => c.value);
  lsSet(LS.disabledTools, off.length ? JSON.stringify(off) : "");
  toast("Settings saved");
}

// ------------------------------------------------------------------ import / export

async function exportAll() {
  const all = await store.listConversations();
  if (!all.length) { toast("There are no conversations to export."); return; }
  const blob = new Blob([JSON.stringify(store.exportPayload(all), null, 2)], { type: "application/json" });
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = `llamaserve-chats-${new Date().toISOString().slice(0, 10)}.json`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
  toast(`Exported ${all.length} conversation${all.length === 1 ? "" : "s"}`);
}

async function importFile(file) {
  try {
    const convs = store.parseImport(await file.text());
    const ids = new Set(state.conversations.map((c) => c.id));
    for (const c of convs) {
      if (ids.has(c.id)) c.id = store.newId();
      ids.add(c.id);
      await store.saveConversation(c);
      state.conversations.push(c);
    }
    sortConversations();
    renderConvList();
    toast(`Imported ${convs.length} conversation${convs.length === 1 ? "" : "s"}`);
  } catch (err) {
    toast(`Import failed: ${err.message || err}`, { kind: "error", timeout: 6000 });
  } finally {
    el.importFile.value = "";
  }
}

// ------------------------------------------------------------------ events

function bindEvents() {
  el.composer.addEventListener("submit", (e) => {
    e.preventDefault();
    sendMessage(el.input.value);
  });
  el.input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing && !e.altKey && !e.ctrlKey && !e.metaKey) {
      e.preventDefault();
      if (!state.gen) sendMessage(el.input.value);
    }
  });
  el.input.addEventListener("input", () => { autosize(); updateSendState(); });
  el.attach.addEventListener("click", () => el.attachFile.click());
  el.attachFile.addEventListener("change", async () => {
    await addFiles([...el.attachFile.files]);
    el.attachFile.value = "";
  });
  el.input.addEventListener("paste", (e) => {
    const files = [...(e.clipboardData?.files || [])];
    if (files.length && (state.modalities.vision || state.modalities.audio)) {
      e.preventDefault();
      addFiles(files);
    }
  });
  el.composer.addEventListener("dragover", (e) => {
    if (!(state.modalities.vision || state.modalities.audio)) return;
    e.preventDefault();
    el.composer.classList.add("dragging");
  });
  el.composer.addEventListener("dragleave", () => el.composer.classList.remove("dragging"));
  el.composer.addEventListener("drop", (e) => {
    el.composer.classList.remove("dragging");
    const files = [...(e.dataTransfer?.files || [])];
    if (!files.length || !(state.modalities.vision || state.modalities.audio)) return;
    e.preventDefault();
    addFiles(files);
  });
  el.stop.addEventListener("click", stopGeneration);

  el.messages.addEventListener("click", async (e) => {
    const b = e.target.closest("button[data-action]");
    if (!b) return;
    const root = b.closest(".msg");
    const msg = root && views.get(root.dataset.id)?.msg;
    switch (b.dataset.action) {
      case "copy-code": {
        const code = b.closest(".code-block")?.querySelector("code")?.textContent || "";
        if (await copyText(code)) flashCopied(b);
        break;
      }
      case "copy":
        if (msg && await copyText(msg.content)) { flashCopied(b); announce("Copied."); }
        break;
      case "edit": if (msg) startEdit(msg); break;
      case "edit-cancel": cancelEdit(); break;
      case "edit-save": if (msg) saveEdit(msg, root.querySelector(".edit-input").value); break;
      case "regenerate": regenerate(); break;
      default: break;
    }
  });

  el.suggestions.addEventListener("click", (e) => {
    const chip = e.target.closest(".chip");
    if (chip) sendMessage(chip.dataset.prompt);
  });

  el.convList.addEventListener("click", (e) => {
    const b = e.target.closest("button[data-action]");
    if (!b) return;
    const li = b.closest("li");
    const conv = state.conversations.find((c) => c.id === li.dataset.id);
    if (!conv) return;
    if (b.dataset.action === "open") openConversation(conv);
    else if (b.dataset.action === "delete") removeConversation(conv);
    else if (b.dataset.action === "rename") startRename(li, conv);
  });
  el.convFilter.addEventListener("input", renderConvList);
  el.newChat.addEventListener("click", () => newChat());
  el.newChatTop.addEventListener("click", () => newChat());

  el.sidebarToggle.addEventListener("click", toggleSidebar);
  el.sidebarClose.addEventListener("click", () => closeDrawer());
  el.scrim.addEventListener("click", () => closeDrawer());
  narrow.addEventListener("change", onLayoutChange);

  el.themeToggle.addEventListener("click", () => setTheme(effectiveTheme() === "dark" ? "light" : "dark"));
  prefersDark.addEventListener("change", applyTheme);

  // Cancel buttons are type="button" so that Enter in a field submits (saves), never cancels.
  for (const b of document.querySelectorAll("[data-close-dialog]")) {
    b.addEventListener("click", () => b.closest("dialog").close("cancel"));
  }
  el.settingsButton.addEventListener("click", openSettings);
  el.settingsForm.addEventListener("submit", onSettingsSubmit);
  el.settingsReset.addEventListener("click", () => {
    settings.toForm(el.settingsForm, settings.defaults());
    el.settingsForm.elements.theme.value = "system";
    announce("Defaults restored in the form. Save to apply.");
  });

  el.modelSelect.addEventListener("change", onModelChange);
  el.bannerRetry.addEventListener("click", loadServerInfo);

  el.exportBtn.addEventListener("click", exportAll);
  el.importBtn.addEventListener("click", () => el.importFile.click());
  el.importFile.addEventListener("change", () => { if (el.importFile.files[0]) importFile(el.importFile.files[0]); });

  el.scroller.addEventListener("scroll", onScroll, { passive: true });
  el.jump.addEventListener("click", () => { scrollToBottom(true); el.input.focus(); });

  document.addEventListener("keydown", (e) => {
    if (e.key !== "Escape" || e.defaultPrevented) return;
    if (document.querySelector("dialog[open]")) return;   // the dialog closes itself
    if (drawerOpen()) { e.preventDefault(); closeDrawer(); return; }
    if (state.gen) { e.preventDefault(); stopGeneration(); }
  });
  window.addEventListener("resize", autosize);
}

function flashCopied(b) {
  const prev = b.innerHTML;
  b.classList.add("copied");
  if (b.classList.contains("code-copy")) b.textContent = "Copied";
  else b.innerHTML = icon("check");
  setTimeout(() => { b.classList.remove("copied"); b.innerHTML = prev; }, 1400);
}

// ------------------------------------------------------------------ start

async function init() {
  applyTheme();
  api.setKeyPrompter(promptForKey);
  if (lsGet(LS.sidebar) === "1") el.app.classList.add("sidebar-collapsed");
  bindEvents();
  onLayoutChange();
  try {
    state.conversations = await store.listConversations();
  } catch (err) {
    console.error(err);
    toast("Saved conversations could not be loaded.", { kind: "error" });
  }
  const last = state.conversations.find((c) => c.id === lsGet(LS.current));
  if (last) openConversation(last, { focus: false });
  else newChat({ focus: false });
  autosize();
  updateSendState();
  el.app.dataset.ready = "true";
  if (!narrow.matches || !drawerOpen()) el.input.focus();
  loadServerInfo();
}

init();
