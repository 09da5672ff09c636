// The inspector's views. Each takes the <main> element and the URL's
// query, draws itself from the admin API, and returns a function that
// stops its polling. Text from the server is only ever set as text.

import {
  el, svg, replace, time, ago, copyButton, badge, tone, eventPath, apiEventPath, api, pretty, jsonDiff,
} from "./util.js";

const POLL_MS = 2000;
const go = (href) => window.dispatchEvent(new CustomEvent("idemhook:go", { detail: { href } }));

/** Runs `tick` every `every` ms while the tab is visible. */
function poll(tick, every = POLL_MS) {
  let stopped = false;
  let timer = null;
  const loop = async () => {
    if (stopped) return;
    if (!document.hidden) {
      try {
        await tick();
      } catch {
        // The next tick tries again; a 401 already shows the sign-in.
      }
    }
    if (!stopped) timer = setTimeout(loop, every);
  };
  timer = setTimeout(loop, every);
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

function heading(text, ...extra) {
  return el("div", { class: "heading" }, el("h1", {}, text), ...extra);
}

// ---------------------------------------------------------------------------
// Events

const STATES = ["", "accepted", "processing", "completed", "failed"];
const SINCE = [["", "any time"], ["15m", "last 15 min"], ["1h", "last hour"], ["24h", "last 24 h"], ["7d", "last 7 days"]];

export async function events(main, query) {
  const filters = {
    source: query.get("source") || "",
    status: query.get("status") || "",
    type: query.get("type") || "",
    since: query.get("since") || "",
    until: query.get("until") || "",
    id: query.get("id") || "",
  };
  const apiQuery = () => {
    const q = new URLSearchParams({ limit: "200", details: "true" });
    for (const [k, v] of Object.entries(filters)) if (v) q.set(k, v);
    return q.toString();
  };
  const uiQuery = () => {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(filters)) if (v) q.set(k, v);
    const s = q.toString();
    return s ? `/ui/?${s}` : "/ui/";
  };

  const input = (name, placeholder, extra = {}) => {
    const i = el("input", { name, id: `f-${name}`, placeholder, value: filters[name], autocomplete: "off", ...extra });
    return i;
  };
  const select = (name, options) => {
    const s = el("select", { name, id: `f-${name}` }, options.map(([v, label]) => el("option", { value: v }, label)));
    s.value = filters[name];
    return s;
  };
  const search = input("id", "Search by event id  ( / )", { type: "search", class: "search" });
  // "until": unix seconds in the URL and the API, local time in the field.
  const untilInput = el("input", { type: "datetime-local", name: "until", id: "f-until", title: "received before" });
  if (filters.until) {
    const d = new Date(Number(filters.until) * 1000);
    untilInput.value = new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 16);
  }
  const form = el(
    "form",
    { class: "filters", id: "filters" },
    search,
    input("source", "source"),
    select("status", STATES.map((s) => [s, s || "any state"])),
    input("type", "type"),
    select("since", SINCE),
    untilInput,
    el("button", { type: "submit" }, "Filter"),
  );
  const apply = () => {
    for (const k of Object.keys(filters)) filters[k] = form.elements[k].value.trim();
    filters.until = untilInput.value ? String(Math.floor(new Date(untilInput.value).getTime() / 1000)) : "";
    history.replaceState(null, "", uiQuery());
    etag = null;
    refresh(false);
  };
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    apply();
  });
  for (const s of form.querySelectorAll("select, input[type=datetime-local]")) s.addEventListener("change", apply);

  const plan = el("div", { id: "batch-plan" });
  const batch = el("button", { type: "button", id: "batch-replay", title: "Replay the failed jobs this filter covers (shows the plan first)" }, "Replay failed…");
  batch.addEventListener("click", () => batchPlan(plan, filters));

  const status = el("span", { class: "muted", id: "list-status" });
  const tbody = el("tbody", { id: "events" });
  const table = el(
    "table",
    { class: "list" },
    el("thead", {}, el("tr", {}, el("th", {}, "Received"), el("th", { class: "wide" }, "Source"), el("th", {}, "Event id"), el("th", { class: "wide" }, "Type"), el("th", {}, "State"))),
    tbody,
  );
  const older = el("p", { class: "more" });
  replace(
    main,
    heading("Events", status, batch),
    form,
    plan,
    el("div", { class: "scroll" }, table),
    older,
    el("p", { class: "muted hint" }, "Keys: j / k to move, Enter to open, / to search. New events appear by themselves."),
  );

  let etag = null;
  let seen = null;
  let selected = 0;
  let rows = [];
  const select_ = (i) => {
    if (!rows.length) return;
    selected = Math.max(0, Math.min(rows.length - 1, i));
    rows.forEach((r, j) => r.classList.toggle("selected", j === selected));
    rows[selected].scrollIntoView({ block: "nearest" });
  };

  async function refresh(conditional = true) {
    const result = await api(`/api/events?${apiQuery()}`, { etag: conditional ? etag : null });
    if (result.notModified) return;
    etag = result.etag;
    const list = result.data || [];
    const key = (e) => `${e.source}\u0000${e.event_id}`;
    const before = seen;
    seen = new Set(list.map(key));
    rows = list.map((e) => {
      const classes = [`s-${e.state}`];
      if (e.incidents > 0) classes.push("mismatch");
      if (before && !before.has(key(e))) classes.push("new");
      const link = el("a", { href: eventPath(e.source, e.event_id), "data-link": true, class: "mono" }, e.event_id);
      return el(
        "tr",
        { class: classes.join(" "), dataset: { href: eventPath(e.source, e.event_id) } },
        el("td", { class: "nowrap" }, time(e.received_at)),
        el("td", { class: "wide" }, e.source),
        el("td", { class: "id" }, link),
        el("td", { class: "wide" }, e.type ?? el("span", { class: "muted" }, "–")),
        el("td", {}, badge(e.state), e.incidents > 0 ? badge("mismatch") : null),
      );
    });
    if (rows.length) replace(tbody, rows);
    else replace(tbody, el("tr", {}, el("td", { colspan: 5, class: "muted empty" }, "No events match.")));
    status.textContent = `${list.length}${list.length === 200 ? "+" : ""} shown · updated ${new Date().toLocaleTimeString()}`;
    replace(older);
    if (list.length === 200) {
      const q = new URLSearchParams(uiQuery().split("?")[1] || "");
      q.set("until", String(list[list.length - 1].received_at));
      older.append(el("a", { href: `/ui/?${q}`, "data-link": true }, "Older events →"));
    }
    select_(Math.min(selected, rows.length - 1));
  }
  await refresh(false);

  const onKey = (e) => {
    if (e.target instanceof HTMLInputElement || e.target instanceof HTMLSelectElement) {
      if (e.key === "Escape") e.target.blur();
      return;
    }
    if (e.metaKey || e.ctrlKey || e.altKey) return;
    if (e.key === "j") select_(selected + 1);
    else if (e.key === "k") select_(selected - 1);
    else if (e.key === "Enter" && rows[selected]) go(rows[selected].dataset.href);
    else if (e.key === "/") {
      e.preventDefault();
      search.focus();
      search.select();
    } else return;
    e.preventDefault();
  };
  document.addEventListener("keydown", onKey);
  const stop = poll(() => refresh(true));
  return () => {
    stop();
    document.removeEventListener("keydown", onKey);
  };
}

/** The dry run of a batch replay of the filter's failed jobs, then a confirming click. */
async function batchPlan(box, filters) {
  const body = { status: "failed" };
  if (filters.source) body.source = filters.source;
  if (filters.since) body.since = filters.since;
  replace(box, el("p", { class: "muted" }, "Asking for the plan…"));
  try {
    const { data } = await api("/api/replay", { method: "POST", body: { ...body, dry_run: true } });
    showPlan(box, data, async () => {
      const { data: done } = await api("/api/replay", { method: "POST", body });
      return done;
    });
  } catch (e) {
    replace(box, el("p", { class: "error" }, `No plan: ${e.message}`));
  }
}

/**
 * Shows a replay plan (the dry run) and a button that carries it out;
 * `confirm` makes the real call and returns its report.
 */
function showPlan(box, plan, confirm) {
  const steps = plan.would || [];
  const cancel = el("button", { type: "button", class: "quiet" }, "Cancel");
  cancel.addEventListener("click", () => replace(box));
  const items = steps.map((s) =>
    el("li", {}, el("a", { href: eventPath(s.source, s.event_id), "data-link": true, class: "mono" }, `${s.source}/${s.event_id}`), ` · ${s.action}: `, s.what),
  );
  const notes = (plan.notes || []).map((n) => el("li", { class: "muted" }, n));
  const left = (plan.left_alone || []).map((l) => el("li", { class: "muted" }, `${l.source}/${l.event_id} · ${l.action} (${l.status}): ${l.reason}`));
  const children = [
    el("h2", {}, "Replay plan (dry run: nothing has changed yet)"),
    steps.length ? el("ol", { class: "plan-steps" }, items) : el("p", {}, "Nothing to replay."),
    notes.length || left.length ? el("ul", {}, notes, left) : null,
  ];
  const buttons = el("div", { class: "buttons" });
  if (steps.length) {
    const go_ = el("button", { type: "button", class: "danger", id: "confirm-replay" }, `Confirm: replay ${steps.length} job${steps.length === 1 ? "" : "s"}`);
    go_.addEventListener("click", async () => {
      go_.disabled = true;
      cancel.disabled = true;
      try {
        const done = await confirm();
        showDone(box, done);
      } catch (e) {
        replace(box, el("div", { class: "card plan" }, el("p", { class: "error" }, `Replay failed: ${e.message}`)));
      }
    });
    buttons.append(go_);
  }
  buttons.append(cancel);
  replace(box, el("div", { class: "card plan", id: "replay-plan" }, children, buttons));
}

function showDone(box, report) {
  const jobs = report.jobs || [];
  const items = jobs.map((j) =>
    el(
      "li",
      {},
      el("a", { href: `${eventPath(j.source, j.event_id)}#attempt-${encodeURIComponent(j.action)}-${j.attempt}`, "data-link": true, class: "attempt-link" }, `${j.source}/${j.event_id} · ${j.action} attempt #${j.attempt}`),
      ` · ${j.result}`,
      j.error ? el("span", { class: "error" }, ` ${j.error}`) : null,
    ),
  );
  replace(
    box,
    el("div", { class: "card plan done", id: "replay-result" }, el("h2", {}, `Replayed ${report.replayed ?? jobs.length} job${(report.replayed ?? jobs.length) === 1 ? "" : "s"}`), el("ul", {}, items)),
  );
}

// ---------------------------------------------------------------------------
// One event

export async function event(main, source, eventId) {
  let last = "";
  let planOpen = false;
  // The last replay's result stays shown while the page redraws.
  let replayed = null;
  let first = true;
  const onPlan = (open, report) => {
    planOpen = open;
    if (report) replayed = report;
  };
  const draw = (e) => {
    document.title = `${e.source}/${e.event_id} · idemhook`;
    replace(main, eventView(e, { onPlan }));
    if (replayed) showDone(main.querySelector("#event-plan"), replayed);
    const target = location.hash && document.getElementById(decodeURIComponent(location.hash.slice(1)));
    if (target) {
      target.classList.add("target");
      if (first) target.scrollIntoView({ block: "center" });
    }
    first = false;
  };
  let etag = null;
  const load = async () => {
    const result = await api(`${apiEventPath(source, eventId)}?details=true`, { etag: planOpen ? null : etag });
    if (result.notModified) return;
    const text = JSON.stringify(result.data);
    if (text !== last && !planOpen) {
      last = text;
      etag = result.etag;
      draw(result.data);
    }
  };
  try {
    await load();
  } catch (e) {
    replace(main, heading("Event"), el("p", { class: "error" }, e.message), el("p", {}, el("a", { href: "/ui/", "data-link": true }, "Back to the events")));
    return () => {};
  }
  return poll(load);
}

function field(label, ...value) {
  return [el("dt", {}, label), el("dd", {}, ...value)];
}

function eventView(e, { onPlan }) {
  const verified =
    e.verified_with === null || e.verified_with === undefined
      ? "unsigned (kind none)"
      : `secret #${e.verified_with} (0-based; checked once, at receipt)`;
  const summary = el(
    "dl",
    { class: "facts" },
    field("State", badge(e.state)),
    field("Type", e.type ?? el("span", { class: "muted" }, "–")),
    field("Received", time(e.received_at), el("span", { class: "muted" }, ` · ${ago(e.received_at)}`)),
    field("Completed", time(e.completed_at)),
    field("Verified with", verified),
    field("Payload hash", el("span", { class: "mono small" }, e.payload_hash), " ", copyButton(e.payload_hash)),
  );

  const planBox = el("div", { id: "event-plan" });
  const jobs = (e.jobs || []).map((j) => jobCard(e, j, planBox, onPlan));

  return el(
    "article",
    { class: "event" },
    el("p", { class: "crumbs" }, el("a", { href: "/ui/", "data-link": true }, "Events"), " / ", e.source),
    el("div", { class: "heading" }, el("h1", { class: "mono id-title" }, e.event_id), copyButton(e.event_id, "Copy id"), badge(e.state)),
    mismatchBanner(e),
    el("section", { class: "card" }, summary),
    el("section", {}, el("h2", {}, "Actions"), jobs.length ? el("div", { class: "jobs" }, jobs) : el("p", { class: "muted" }, "No action takes this event's type."), planBox),
    timelineSection(e),
    mismatchSection(e),
    payloadSection(e),
    headersSection(e),
  );
}

function jobCard(e, j, planBox, onPlan) {
  const force = j.status === "done";
  const button = el(
    "button",
    { type: "button", class: "replay", dataset: { action: j.action } },
    force ? "Re-run (force)…" : "Replay…",
  );
  button.addEventListener("click", async () => {
    onPlan(true);
    const body = { action: j.action };
    if (force) body.force = true;
    replace(planBox, el("p", { class: "muted" }, "Asking for the plan…"));
    try {
      const { data } = await api(`${apiEventPath(e.source, e.event_id)}/replay`, { method: "POST", body: { ...body, dry_run: true } });
      showPlan(planBox, data, async () => {
        const { data: done } = await api(`${apiEventPath(e.source, e.event_id)}/replay`, { method: "POST", body });
        onPlan(false, done);
        return done;
      });
      planBox.querySelector("button.quiet")?.addEventListener("click", () => onPlan(false));
    } catch (err) {
      onPlan(false);
      replace(planBox, el("p", { class: "error" }, `No plan: ${err.message}`));
    }
  });
  const attempts = j.attempts || [];
  return el(
    "div",
    { class: `job card s-${j.status}` },
    el("div", { class: "job-head" }, el("strong", {}, j.action), el("span", { class: "muted" }, ` ${j.kind}`), badge(j.status)),
    el("p", { class: "muted small" }, `${attempts.length} attempt${attempts.length === 1 ? "" : "s"}`, j.next_attempt_at ? [" · next ", time(j.next_attempt_at)] : null, j.waiting_for ? ` · waiting for ${j.waiting_for}` : null),
    j.last_error ? el("p", { class: "error small" }, j.last_error) : null,
    button,
  );
}

function payloadSection(e) {
  let body;
  if (e.payload === null || e.payload === undefined) {
    body = el("p", { class: "muted" }, e.erased_at ? ["Erased at ", time(e.erased_at), " (the key and payload hash are kept)."] : "No body stored.");
  } else {
    const text = pretty(e.payload);
    body = [
      el("div", { class: "bar" }, el("span", { class: "muted small" }, typeof e.payload === "string" ? "raw text" : "JSON, pretty-printed", e.content_type ? ` · ${e.content_type}` : ""), copyButton(text, "Copy payload")),
      el("pre", { class: "payload", id: "payload" }, text),
    ];
  }
  return el("section", {}, el("h2", {}, "Payload"), body);
}

function headersSection(e) {
  const headers = e.headers && typeof e.headers === "object" ? Object.entries(e.headers) : [];
  if (!headers.length) return el("section", {}, el("h2", {}, "Kept headers"), el("p", { class: "muted" }, e.headers === null ? "None kept (or erased)." : "None."));
  return el(
    "section",
    {},
    el("h2", {}, "Kept headers"),
    el("div", { class: "scroll" }, el("table", { class: "kv", id: "headers" }, el("tbody", {}, headers.map(([k, v]) => el("tr", {}, el("th", { class: "mono" }, k), el("td", { class: "mono" }, typeof v === "string" ? v : JSON.stringify(v))))))),
  );
}

/**
 * Said first on a mismatched event's page: later deliveries with its id
 * carried another body. Links to the comparison when a body was kept.
 */
function mismatchBanner(e) {
  const mismatches = (e.incidents || []).filter((i) => i.kind === "payload_mismatch");
  if (!mismatches.length) return null;
  const n = mismatches.length;
  const compared = mismatches.some((i) => i.payload !== null && i.payload !== undefined);
  return el(
    "p",
    { class: "banner", id: "mismatch-banner", role: "alert" },
    el("strong", {}, "Payload mismatch: "),
    `${n} ${n === 1 ? "delivery" : "deliveries"} of this event id came with a different payload. `,
    "The stored payload is the first one's, and only it ran the actions. ",
    compared ? el("a", { href: "#mismatch", "data-link": true }, "See how they differ") : "The other bodies are no longer kept.",
  );
}

function mismatchSection(e) {
  const withBody = (e.incidents || []).filter((i) => i.kind === "payload_mismatch" && i.payload !== null && i.payload !== undefined);
  if (!withBody.length) return null;
  return el(
    "section",
    { id: "mismatch" },
    el("h2", {}, "Mismatched duplicates"),
    withBody.map((i, n) => {
      const id = `mismatch-${n}`;
      const jsonBoth = typeof i.payload !== "string" && e.payload !== null && typeof e.payload !== "string";
      let diff;
      if (jsonBoth) {
        const rows = jsonDiff(e.payload, i.payload);
        diff = rows.length
          ? el("table", { class: "diff" }, el("thead", {}, el("tr", {}, el("th", {}, "Field"), el("th", {}, "Stored"), el("th", {}, "This duplicate"))), el("tbody", {}, rows.map((r) => el("tr", { class: `d-${r.kind}` }, el("td", { class: "mono" }, r.path), el("td", { class: "mono" }, r.kind === "added" ? "(absent)" : pretty(r.before)), el("td", { class: "mono" }, r.kind === "removed" ? "(absent)" : pretty(r.after))))))
          : el("p", { class: "muted" }, "Same JSON value: the difference is in formatting or in fields the hash reads differently.");
      } else {
        diff = el("div", { class: "two" }, el("div", {}, el("h3", {}, "Stored"), el("pre", { class: "payload" }, e.payload === null ? "(erased)" : pretty(e.payload))), el("div", {}, el("h3", {}, "This duplicate"), el("pre", { class: "payload" }, pretty(i.payload))));
      }
      return el("div", { class: "card", id }, el("p", {}, time(i.created_at), " · ", i.detail || ""), diff);
    }),
  );
}

/**
 * Deliveries, attempts (and checks), replays and incidents, in time order.
 * Sorted by the milliseconds the server adds when it has them; ties
 * keep the order things were pushed in: each job's checks and attempts by
 * number, with each replay after the attempt it followed.
 */
function timelineSection(e) {
  const items = [];
  // Within one job, things happen in the order pushed: a time known only
  // to the second is held no earlier than the job's previous item.
  let jobMs = null;
  const push = (item) => {
    let ms = item.ms ?? item.at * 1000;
    if (jobMs !== null) {
      ms = Math.max(ms, jobMs);
      jobMs = ms;
    }
    items.push({ ...item, ms, order: items.length });
  };
  for (const d of e.deliveries || []) {
    push({ at: d.received_at, ms: d.received_at_ms, kind: "delivery", tone: tone(d.outcome), node: [badge(d.outcome), " from ", el("span", { class: "mono" }, d.remote ?? "?")] });
  }
  const replayNode = (r) => [el("strong", {}, r.action), ` replayed from ${r.from_status}${r.forced ? " (forced)" : ""} by ${r.origin}`];
  const replays = e.replays || [];
  const placed = new Set();
  const replaysAfter = (action, n) => {
    replays.forEach((r, i) => {
      if (!placed.has(i) && r.action === action && (r.after_attempt ?? -1) === n) {
        placed.add(i);
        push({ at: r.replayed_at, ms: r.replayed_at_ms, kind: "replay", node: replayNode(r) });
      }
    });
  };
  for (const j of e.jobs || []) {
    jobMs = -Infinity;
    const checks = j.checks || [];
    const checksFor = (n) => {
      for (const c of checks.filter((c) => c.n === n)) {
        const bits = [el("strong", {}, j.action), ` asked before #${c.n}: `, badge(c.answer === "found" ? "found" : c.answer)];
        if (c.http_status !== null && c.http_status !== undefined) bits.push(` HTTP ${c.http_status}`);
        if (c.error) bits.push(el("div", { class: "error small" }, c.error));
        push({ at: c.asked_at, ms: c.asked_at_ms, kind: "check", tone: tone(c.answer), node: bits });
      }
    };
    replaysAfter(j.action, 0);
    for (const a of j.attempts || []) {
      checksFor(a.n);
      const check = a.error_kind === "confirmed" || a.error_kind === "check";
      const bits = [el("strong", {}, j.action), ` #${a.n} `, badge(a.outcome ?? "running")];
      if (a.http_status !== null && a.http_status !== undefined) bits.push(` HTTP ${a.http_status}`);
      if (a.error_kind) bits.push(" ", el("span", { class: "tag" }, a.error_kind));
      if (a.finished_at !== null && a.finished_at !== undefined) bits.push(el("span", { class: "muted" }, a.finished_at > a.started_at ? ` · ${a.finished_at - a.started_at} s` : " · under 1 s"));
      if (a.request_id) bits.push(el("span", { class: "muted" }, " · request "), el("span", { class: "mono" }, a.request_id));
      if (a.error) bits.push(el("div", { class: "error small" }, a.error));
      if (a.response) bits.push(el("details", {}, el("summary", {}, "response"), el("pre", { class: "response" }, a.response)));
      push({ at: a.started_at, ms: a.started_at_ms, kind: check ? "check" : "attempt", tone: tone(a.outcome ?? "running"), id: `attempt-${j.action}-${a.n}`, node: bits });
      replaysAfter(j.action, a.n);
    }
    // Checks for an attempt not made yet (the answer said "already done",
    // or the next attempt is still to come).
    const made = new Set((j.attempts || []).map((a) => a.n));
    for (const n of new Set(checks.map((c) => c.n))) if (!made.has(n)) checksFor(n);
    jobMs = null;
  }
  replays.forEach((r, i) => {
    if (!placed.has(i)) push({ at: r.replayed_at, ms: r.replayed_at_ms, kind: "replay", node: replayNode(r) });
  });
  for (const i of e.incidents || []) {
    push({ at: i.created_at, ms: i.created_at_ms, kind: "incident", tone: "bad", node: [badge(i.kind), " ", i.detail || ""] });
  }
  items.sort((a, b) => a.ms - b.ms || a.order - b.order);
  return el(
    "section",
    {},
    el("h2", {}, "Timeline"),
    el(
      "ol",
      { class: "timeline", id: "timeline" },
      items.map((it) => el("li", { class: `t-${it.kind} tone-${it.tone ?? "info"}`, id: it.id }, el("span", { class: "t-when" }, time(it.at)), el("span", { class: "t-kind" }, it.kind), el("span", { class: "t-what" }, it.node))),
    ),
  );
}

// ---------------------------------------------------------------------------
// Actions

export async function actions(main) {
  const tbody = el("tbody", { id: "actions" });
  const note = el("p", { class: "muted" });
  replace(
    main,
    heading("Actions"),
    el("p", { class: "muted" }, "Pausing a forward action holds its jobs (status paused) until it is resumed; nothing is lost."),
    el("div", { class: "scroll" }, el("table", { class: "list" }, el("thead", {}, el("tr", {}, ["Source", "Action", "Kind", "Pending", "Processing", "Failed", "Paused", "Circuit", ""].map((h) => el("th", {}, h)))), tbody)),
    note,
  );
  const load = async () => {
    const { data } = await api("/api/actions");
    const rows = (data || []).map((a) => {
      const c = a.counts || {};
      let control = el("span", { class: "muted small" }, "runs in the claim");
      if (a.kind === "forward") {
        control = el("button", { type: "button", class: a.paused ? "primary" : "", dataset: { source: a.source, action: a.action } }, a.paused ? "Resume" : "Pause");
        control.addEventListener("click", async () => {
          control.disabled = true;
          try {
            const verb = a.paused ? "resume" : "pause";
            const { data: done } = await api(`/api/actions/${encodeURIComponent(a.source)}/${encodeURIComponent(a.action)}/${verb}`, { method: "POST" });
            const held = done.jobs_paused ?? done.jobs_resumed ?? 0;
            note.textContent = `${a.source}/${a.action} ${verb}d: ${held} waiting job${held === 1 ? "" : "s"} ${a.paused ? "released" : "held"}.`;
          } catch (e) {
            note.textContent = `Could not change ${a.source}/${a.action}: ${e.message}`;
          }
          await load();
        });
      }
      const n = (x) => el("td", { class: `num${x > 0 ? " nonzero" : ""}` }, String(x ?? 0));
      return el(
        "tr",
        { class: a.paused ? "paused" : "" },
        el("td", {}, a.source),
        el("td", {}, el("strong", {}, a.action), a.paused ? [" ", badge("paused")] : null),
        el("td", {}, a.kind),
        n(c.pending), n(c.processing), n(c.failed), n(c.paused),
        el("td", {}, circuitCell(a.circuit)),
        el("td", {}, control),
      );
    });
    replace(tbody, rows.length ? rows : el("tr", {}, el("td", { colspan: 9, class: "muted empty" }, "No actions configured.")));
  };
  await load();
  return poll(load);
}

/** An action's circuit: none, closed (with failures counted) or open (since, next probe). */
function circuitCell(c) {
  if (!c) return el("span", { class: "muted small" }, "none");
  if (c.state === "open") {
    return el("span", {}, badge("open", "warn"), el("div", { class: "muted small" }, "since ", time(c.opened_at), ` · ${c.failures} failures · next probe `, time(c.next_probe_at)));
  }
  return el("span", {}, badge("closed"), c.failures > 0 ? el("span", { class: "muted small" }, ` ${c.failures} failure${c.failures === 1 ? "" : "s"}`) : null);
}

// ---------------------------------------------------------------------------
// Reconcile

export async function reconcile(main) {
  const body = el("div", { id: "reconcile" });
  replace(main, heading("Reconcile"), el("p", { class: "muted" }, "Jobs that need an operator: stuck past their lease, overdue, failed (dead letters waiting for a replay), order keys a dead letter holds, and paused actions."), body);
  const load = async () => {
    const { data } = await api("/api/reconcile");
    const section = (name, title, list, row) =>
      el(
        "section",
        { class: "card" },
        el("h2", {}, `${title} `, badge(String(data.counts?.[name] ?? list.length), (data.counts?.[name] ?? 0) > 0 ? "warn" : "")),
        list.length ? el("ul", { class: "rec" }, list.map(row)) : el("p", { class: "muted" }, "None."),
      );
    const job = (j) =>
      el(
        "li",
        {},
        el("a", { href: eventPath(j.source, j.event_id), "data-link": true, class: "mono" }, `${j.source}/${j.event_id}`),
        ` · ${j.action} · ${j.attempts} attempt${j.attempts === 1 ? "" : "s"} · `,
        badge(j.status),
        j.last_error ? el("div", { class: "error small" }, j.last_error) : null,
      );
    replace(
      body,
      el("p", {}, data.clean ? badge("clean") : badge("needs attention", "warn")),
      section("stuck", "Stuck", data.stuck || [], job),
      section("overdue", "Overdue", data.overdue || [], job),
      section("failed", "Failed", data.failed || [], job),
      section("held", "Held order keys", data.held || [], (j) => {
        const item = job(j);
        item.append(el("div", { class: "muted small" }, `holds the later jobs of order key ${j.order_key}: a replay to done or a resolve releases them, in order`));
        return item;
      }),
      section("paused", "Paused", data.paused || [], (p) => el("li", {}, el("a", { href: "/ui/actions", "data-link": true }, `${p.source}/${p.action}`), ` · paused `, time(p.paused_at), ` · ${p.waiting} waiting`)),
      catchupSection(data.catchup || []),
      section("circuits", "Open circuits", data.circuits || [], (c) => el("li", {}, el("a", { href: "/ui/actions", "data-link": true }, `${c.source}/${c.action}`), ` · open since `, time(c.opened_at), ` · ${c.failures} failures · next probe `, time(c.next_probe_at), ` · ${c.waiting} waiting`)),
    );
  };
  await load();
  return poll(load);
}

// The last catch-up run of each source with a catchup table (none: no card).
function catchupSection(runs) {
  if (!runs.length) return null;
  const row = (c) =>
    el(
      "li",
      { class: "catchup" },
      el("span", { class: "mono" }, c.source),
      ` · ${c.provider} · `,
      c.last_run_at
        ? el("span", {}, "last run ", time(c.last_run_at), ` · ${c.claimed} claimed · ${c.redelivery_requested} redelivery requested · ${c.already_stored} already stored`)
        : el("span", { class: "muted" }, "no run yet"),
      c.error ? el("div", { class: "error small" }, c.error) : null,
    );
  return el("section", { class: "card" }, el("h2", {}, "Catch-up from the provider's API"), el("ul", { class: "rec" }, runs.map(row)));
}

// ---------------------------------------------------------------------------
// Overview

export async function overview(main) {
  const chart = el("div", { class: "chart", id: "chart" });
  const totals = el("div", { class: "totals" });
  const updated = el("span", { class: "muted" });
  replace(main, heading("Overview", updated), el("p", { class: "muted" }, "Deliveries by outcome per minute, over the last hour."), el("section", { class: "card" }, chart), totals);
  const load = async () => {
    const { data } = await api("/api/overview");
    drawChart(chart, data);
    updated.textContent = `updated ${new Date().toLocaleTimeString()} · every 10 s`;
    const t = data.totals || {};
    const jobs = data.jobs || {};
    replace(
      totals,
      el("section", { class: "card" }, el("h2", {}, "Last hour"), el("dl", { class: "facts" }, Object.keys(t).length ? Object.entries(t).map(([k, v]) => field(k, String(v))) : field("deliveries", "0"))),
      el("section", { class: "card" }, el("h2", {}, "Jobs now"), el("dl", { class: "facts" }, Object.entries(jobs).map(([k, v]) => field(k, String(v))))),
    );
  };
  await load();
  // Per-minute counts change slowly; the server re-reads only the last
  // two minutes (ops::inspector::OverviewCache).
  return poll(load, 10_000);
}

function drawChart(box, data) {
  const buckets = data.buckets || [];
  const outcomes = (data.outcomes || []).filter((o) => buckets.some((b) => b.counts[o]));
  const max = Math.max(1, ...buckets.map((b) => Object.values(b.counts).reduce((a, n) => a + n, 0)));
  // The left margin holds the largest count's digits (11px text, about 7 units a digit).
  const W = 1000, H = 240, left = Math.max(36, 14 + 7 * String(max).length), bottom = 22, top = 8;
  const bw = (W - left - 4) / Math.max(1, buckets.length);
  const y = (n) => top + (H - top - bottom) * (1 - n / max);
  const g = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "deliveries per minute by outcome", class: "bars" });
  for (const frac of [0, 0.5, 1]) {
    const v = Math.round(max * frac);
    g.append(svg("line", { x1: left, x2: W, y1: y(v), y2: y(v), class: "grid" }));
    g.append(svg("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end", class: "axis" }, String(v)));
  }
  buckets.forEach((b, i) => {
    let acc = 0;
    for (const o of outcomes) {
      const n = b.counts[o] || 0;
      if (!n) continue;
      const rect = svg("rect", { x: left + i * bw + 1, width: Math.max(1, bw - 2), y: y(acc + n), height: y(acc) - y(acc + n), class: `o-${o}` });
      rect.append(svg("title", {}, `${new Date(b.at * 1000).toLocaleTimeString()} · ${o}: ${n}`));
      g.append(rect);
      acc += n;
    }
  });
  // The first and last times are anchored at the chart's edges, so that
  // neither sticks out of it (a centred label at the right edge was cut).
  const last = buckets.length - 1;
  for (const i of [0, Math.floor(buckets.length / 2), last]) {
    const b = buckets[i];
    if (!b) continue;
    const t = new Date(b.at * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    const [x, anchor] = i === last && last > 0 ? [W - 2, "end"] : i === 0 ? [left, "start"] : [left + i * bw + bw / 2, "middle"];
    g.append(svg("text", { x, y: H - 6, "text-anchor": anchor, class: "axis" }, t));
  }
  const legend = el("ul", { class: "legend" }, outcomes.length ? outcomes.map((o) => el("li", {}, el("span", { class: `swatch o-${o}` }), o)) : el("li", { class: "muted" }, "No deliveries in the last hour."));
  replace(box, g, legend);
}
