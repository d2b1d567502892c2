// Generation settings: built-in defaults < the server's `ui_settings` (GET /props) < what the
// user saved (localStorage). Only the user's own choices are stored, so a server default that
// changes later still applies to every field the user left alone.

const STORAGE = "llamaserve.settings";

/** Numeric sampling fields: `null` means "not sent", i.e. the server's own default. */
export const NUMERIC = [
  { key: "temperature", integer: false, min: 0, server: "temperature", aliases: ["temp"] },
  { key: "top_k", integer: true, min: 0, server: "top_k", aliases: [] },
  { key: "top_p", integer: false, min: 0, max: 1, server: "top_p", aliases: [] },
  { key: "min_p", integer: false, min: 0, max: 1, server: "min_p", aliases: [] },
  { key: "max_tokens", integer: true, min: -1, server: "n_predict", aliases: ["n_predict", "max_new_tokens"] },
  { key: "repeat_penalty", integer: false, min: 0, server: "repeat_penalty", aliases: [] },
  { key: "seed", integer: true, min: -1, server: "seed", aliases: [] },
];

const TEXT = [
  { key: "system_prompt", aliases: ["systemMessage", "system_message", "system"] },
];

export const BUILTIN = Object.freeze({
  system_prompt: "",
  temperature: null,
  top_k: null,
  top_p: null,
  min_p: null,
  max_tokens: null,
  repeat_penalty: null,
  seed: null,
});

let serverDefaults = {};   // from /props ui_settings, normalised
let serverParams = {};     // /props default_generation_settings.params, for placeholders

function loadSaved() {
  try {
    const v = JSON.parse(localStorage.getItem(STORAGE) || "{}");
    return v && typeof v === "object" ? v : {};
  } catch { return {}; }
}

function toNumber(v, integer) {
  if (v === null || v === undefined || v === "") return null;
  const n = typeof v === "number" ? v : Number(String(v).trim());
  if (!Number.isFinite(n)) return undefined;  // invalid
  return integer ? Math.trunc(n) : n;
}

/** Maps a loose settings object (ours or llama.cpp webui's key names) onto our keys. */
export function normalise(obj) {
  const out = {};
  if (!obj || typeof obj !== "object") return out;
  for (const f of TEXT) {
    for (const k of [f.key, ...f.aliases]) {
      if (typeof obj[k] === "string") { out[f.key] = obj[k]; break; }
    }
  }
  for (const f of NUMERIC) {
    for (const k of [f.key, ...f.aliases]) {
      if (k in obj) {
        const n = toNumber(obj[k], f.integer);
        if (n !== undefined) { out[f.key] = n; break; }
      }
    }
  }
  return out;
}

export function setServerDefaults(uiSettings, params) {
  serverDefaults = normalise(uiSettings);
  serverParams = params && typeof params === "object" ? params : {};
}

export function defaults() {
  return { ...BUILTIN, ...serverDefaults };
}

export function current() {
  return { ...defaults(), ...normalise(loadSaved()) };
}

/** Stores the fields that differ from the defaults; returns the effective settings. */
export function save(values) {
  const base = defaults();
  const diff = {};
  for (const key of Object.keys(BUILTIN)) {
    if (key in values && values[key] !== base[key]) diff[key] = values[key];
  }
  try { localStorage.setItem(STORAGE, JSON.stringify(diff)); } catch { /* ignore */ }
  return current();
}

export function reset() {
  try { localStorage.removeItem(STORAGE); } catch { /* ignore */ }
  return current();
}

/** Placeholder text for a numeric field: the server's own default value, when known. */
export function placeholderFor(key) {
  const f = NUMERIC.find((x) => x.key === key);
  const v = f && serverParams[f.server];
  if (typeof v !== "number") return "default";
  if (key === "seed" && (v < 0 || v === 4294967295)) return "random";
  if (key === "max_tokens" && v < 0) return "no limit";
  return String(+v.toFixed(4));
}

/** Reads and validates form values. Returns {values} or {error, field}. */
export function fromForm(form) {
  const values = { system_prompt: form.elements.system_prompt.value };
  for (const f of NUMERIC) {
    const el = form.elements[f.key];
    const raw = el.value.trim();
    if (el.validity?.badInput) return { error: `${labelOf(el)} must be a number.`, field: el };
    const n = toNumber(raw, false);
    if (n === undefined) return { error: `${labelOf(el)} must be a number.`, field: el };
    if (n !== null) {
      if (f.integer && !Number.isInteger(n)) return { error: `${labelOf(el)} must be a whole number.`, field: el };
      if (f.min !== undefined && n < f.min) return { error: `${labelOf(el)} must be at least ${f.min}.`, field: el };
      if (f.max !== undefined && n > f.max) return { error: `${labelOf(el)} must be at most ${f.max}.`, field: el };
    }
    values[f.key] = n;
  }
  return { values };
}

function labelOf(el) {
  return el.labels?.[0]?.textContent.trim() || el.name;
}

export function toForm(form, values) {
  form.elements.system_prompt.value = values.system_prompt || "";
  for (const f of NUMERIC) {
    const el = form.elements[f.key];
    el.value = values[f.key] === null || values[f.key] === undefined ? "" : String(values[f.key]);
    el.placeholder = placeholderFor(f.key);
  }
}

/** The sampling part of a request body: only the fields that have a value. */
export function requestParams(values) {
  const out = {};
  for (const f of NUMERIC) {
    const v = values[f.key];
    if (typeof v === "number" && Number.isFinite(v)) out[f.key] = v;
  }
  return out;
}
