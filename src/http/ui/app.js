// The inspector's shell: sign-in, the router (each view has its own URL
// under /ui/), links without reloads, and stopping a view's polling when
// another one takes over. The views themselves are in views.js.

import { el, replace, ApiError } from "./util.js";
import * as views from "./views.js";
import { refused } from "./refused.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const signout = document.getElementById("signout");

/** The running view's stop function (polling timers, key handlers). */
let stopView = () => {};

function route(path) {
  const parts = path.replace(/^\/ui\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  if (parts.length === 0) return { name: "events", render: views.events };
  if (parts[0] === "events" && parts.length === 3) {
    return { name: "events", render: (m, q) => views.event(m, parts[1], parts[2], q) };
  }
  if (parts.length === 1 && parts[0] === "actions") return { name: "actions", render: views.actions };
  if (parts.length === 1 && parts[0] === "reconcile") return { name: "reconcile", render: views.reconcile };
  if (parts.length === 1 && parts[0] === "overview") return { name: "overview", render: views.overview };
  if (parts.length === 1 && parts[0] === "refused") return { name: "refused", render: refused };
  return { name: "", render: (m) => replace(m, el("p", { class: "error" }, "No such view.")) };
}

async function render() {
  stopView();
  stopView = () => {};
  const r = route(location.pathname);
  for (const a of nav.querySelectorAll("a")) {
    a.classList.toggle("active", a.dataset.view === r.name);
  }
  document.title = "idemhook inspector";
  try {
    const stop = await r.render(main, new URLSearchParams(location.search));
    if (typeof stop === "function") stopView = stop;
  } catch (e) {
    if (!(e instanceof ApiError && e.status === 401)) {
      replace(main, el("p", { class: "error" }, `Could not load this view: ${e.message}`));
    }
  }
}

/** Goes to `href` (an inspector path) without a reload. */
export function go(href, { replaceState = false } = {}) {
  if (replaceState) history.replaceState(null, "", href);
  else history.pushState(null, "", href);
  render();
  window.scrollTo(0, 0);
}
window.addEventListener("idemhook:go", (e) => go(e.detail.href, e.detail));

document.addEventListener("click", (e) => {
  const a = e.target.closest("a[data-link]");
  if (!a || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin) return;
  e.preventDefault();
  if (url.pathname === location.pathname && url.search === location.search && url.hash) {
    history.replaceState(null, "", url.pathname + url.search + url.hash);
    const target = document.getElementById(decodeURIComponent(url.hash.slice(1)));
    for (const t of document.querySelectorAll(".target")) t.classList.remove("target");
    target?.classList.add("target");
    target?.scrollIntoView({ block: "center" });
    return;
  }
  go(url.pathname + url.search + url.hash);
});
// A fragment with a token fires popstate before hashchange: that link is
// hashchange's to handle (rendering first would ask the API without a
// session, and its 401 would show the sign-in form again).
window.addEventListener("popstate", () => {
  if (!tokenInAddress()) render();
});

function signedIn(yes) {
  nav.hidden = !yes;
  signout.hidden = !yes;
}

function signInForm(message) {
  stopView();
  stopView = () => {};
  signedIn(false);
  const input = el("input", {
    type: "password",
    id: "token",
    name: "token",
    autocomplete: "current-password",
    placeholder: "admin_token",
    required: true,
  });
  const note = el("p", { class: "error", id: "signin-error", role: "alert" }, message || "");
  const form = el(
    "form",
    { class: "signin card", id: "signin" },
    el("h1", {}, "Sign in"),
    el("p", { class: "muted" }, "The admin token from the server's configuration (admin_token). It is asked once; the browser then keeps a session until you sign out or the server restarts."),
    el("label", { for: "token" }, "Admin token"),
    input,
    el("button", { type: "submit", class: "primary" }, "Sign in"),
    note,
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    note.textContent = "";
    const result = await postToken(input.value);
    if (result === true) {
      signedIn(true);
      render();
    } else {
      note.textContent = result;
      input.select();
    }
  });
  replace(main, form);
  input.focus();
}

/** Signs in; true, or what went wrong. */
async function postToken(token) {
  const response = await fetch("/ui/session", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    credentials: "same-origin",
    body: JSON.stringify({ token }),
  });
  if (response.status === 204) return true;
  if (response.status === 401) return "That is not the admin token.";
  if (response.status === 429) return "Too many wrong tokens from this address: wait a minute.";
  return `Sign-in failed (${response.status}).`;
}

signout.addEventListener("click", async () => {
  await fetch("/ui/session", { method: "DELETE", credentials: "same-origin" });
  signInForm("Signed out.");
});
window.addEventListener("idemhook:signed-out", () => signInForm("Your session ended: sign in again."));

function tokenInAddress() {
  return new URLSearchParams(location.hash.slice(1)).has("token");
}

/**
 * A one-click link from `serve` carries the token in the fragment (never
 * sent to the server in the URL): drop it from the address bar, then sign
 * in with it. Null when the address has no token; else true, or what
 * went wrong.
 */
async function tokenFromAddress() {
  if (!tokenInAddress()) return null;
  const hash = new URLSearchParams(location.hash.slice(1));
  const token = hash.get("token");
  history.replaceState(null, "", location.pathname + location.search);
  return postToken(token);
}

// The link opened in a tab already showing the inspector (the sign-in
// form, say) changes only the fragment: no reload, so start() does not
// run again.
window.addEventListener("hashchange", async () => {
  const result = await tokenFromAddress();
  if (result === null) return;
  if (result !== true) return signInForm(result);
  signedIn(true);
  render();
});

async function start() {
  const result = await tokenFromAddress();
  if (result !== null && result !== true) return signInForm(result);
  const session = await fetch("/ui/session", { credentials: "same-origin", cache: "no-store" });
  const state = session.ok ? await session.json() : { signed_in: false };
  if (!state.signed_in) return signInForm();
  signedIn(true);
  render();
}

start();
