// Small helpers shared by the views. Everything that puts text on the
// page goes through el() and textContent: payloads, headers, ids and
// errors are attacker-controlled and are never parsed as markup.

/** Builds an element: el("a", {href: "/ui/", class: "x"}, "text", child). */
export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) {
      // Handlers are functions, never attribute text.
      if (typeof value === "function") node.addEventListener(name.slice(2), value);
    } else if (name === "dataset") {
      Object.assign(node.dataset, value);
    } else {
      node.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(node, children);
  return node;
}

/** An SVG element (attributes only, no markup). */
export function svg(tag, attrs, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    node.setAttribute(name, String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replaces a node's children. */
export function replace(node, ...children) {
  node.replaceChildren();
  append(node, children);
}

/** A time in the browser's zone, with the unix time on hover. */
export function time(secs) {
  if (secs === null || secs === undefined) return el("span", { class: "muted" }, "–");
  const d = new Date(secs * 1000);
  return el("time", { datetime: d.toISOString(), title: `unix ${secs}` }, d.toLocaleString());
}

/** "3 s ago", "5 min ago". */
export function ago(secs) {
  const s = Math.max(0, Math.round(Date.now() / 1000 - secs));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

/** A button that copies `text` (a string or a function giving one). */
export function copyButton(text, label = "Copy") {
  const button = el("button", { type: "button", class: "copy", title: "Copy to the clipboard" }, label);
  button.addEventListener("click", async () => {
    const value = typeof text === "function" ? text() : text;
    let ok = false;
    try {
      await navigator.clipboard.writeText(value);
      ok = true;
    } catch {
      const area = el("textarea", { class: "offscreen", readonly: true });
      area.value = value;
      document.body.append(area);
      area.select();
      ok = document.execCommand("copy");
      area.remove();
    }
    button.textContent = ok ? "Copied" : "Copy failed";
    setTimeout(() => (button.textContent = label), 1200);
  });
  return button;
}

/** What each stored word means for the reader: the colour of its badge and timeline marker. */
const TONES = {
  ok: ["completed", "done", "ok", "accepted", "clean", "found"],
  bad: ["failed", "error", "bad_signature", "bad_request", "too_large", "unavailable", "mismatch", "payload_mismatch"],
  warn: ["retry", "paused", "duplicate", "pending", "processing"],
};

/** A word's tone: ok, bad, warn, or info for anything else (running, not_found, ...). */
export function tone(word) {
  for (const [name, words] of Object.entries(TONES)) if (words.includes(word)) return name;
  return "info";
}

/** A state or status as a coloured badge. */
export function badge(word, extra = "") {
  return el("span", { class: `badge b-${String(word).replace(/[^a-z_]/g, "")} tone-${tone(word)} ${extra}` }, word);
}

/** Paths of the inspector's own views. */
export function eventPath(source, eventId) {
  return `/ui/events/${encodeURIComponent(source)}/${encodeURIComponent(eventId)}`;
}

export function apiEventPath(source, eventId) {
  return `/api/events/${encodeURIComponent(source)}/${encodeURIComponent(eventId)}`;
}

/** The error an API answer carried, as text. */
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/**
 * Calls the admin API with the session cookie. `etag` makes the request
 * conditional; a 304 answers {notModified: true}.
 */
export async function api(path, { method = "GET", body, etag } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (etag) headers["If-None-Match"] = etag;
  const response = await fetch(path, {
    method,
    headers,
    credentials: "same-origin",
    cache: "no-store",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 304) return { notModified: true, etag };
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const message = (data && data.error) || `${response.status} ${response.statusText}`;
    const error = new ApiError(response.status, message);
    if (response.status === 401) window.dispatchEvent(new CustomEvent("idemhook:signed-out"));
    throw error;
  }
  return { data, etag: response.headers.get("ETag") };
}

/** Pretty JSON, or the text itself. */
export function pretty(value) {
  if (typeof value === "string") return value;
  return JSON.stringify(value, null, 2);
}

/**
 * The field-by-field difference between two JSON values, as rows
 * {path, kind: "changed" | "added" | "removed", before, after}.
 * RFC 6901 pointers name the fields.
 */
export function jsonDiff(before, after, path = "", out = []) {
  const isObject = (v) => v !== null && typeof v === "object";
  if (isObject(before) && isObject(after) && Array.isArray(before) === Array.isArray(after)) {
    const keys = new Set([...Object.keys(before), ...Object.keys(after)]);
    for (const key of keys) {
      const p = `${path}/${String(key).replace(/~/g, "~0").replace(/\//g, "~1")}`;
      if (!(key in after)) out.push({ path: p, kind: "removed", before: before[key] });
      else if (!(key in before)) out.push({ path: p, kind: "added", after: after[key] });
      else jsonDiff(before[key], after[key], p, out);
    }
    return out;
  }
  if (JSON.stringify(before) !== JSON.stringify(after)) {
    out.push({ path: path || "/", kind: "changed", before, after });
  }
  return out;
}
