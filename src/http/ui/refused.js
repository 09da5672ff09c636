// The "Refused" view: deliveries refused with 401 or 400 and kept whole
// (GET /api/rejected), one opened with its headers and body
// (GET /api/rejected/{id}), and a re-ingest per source that shows its
// plan first (POST /api/reingest with dry_run) and runs only on a
// confirming click. Text from the server is only ever set as text.

import { el, replace, time, badge, eventPath, api, pretty } from "./util.js";

const POLL_MS = 2000;

export async function refused(main) {
  const tbody = el("tbody", { id: "refused" });
  const detail = el("div", { id: "refused-detail" });
  const planBox = el("div", { id: "reingest-box" });
  const sources = el("div", { class: "buttons", id: "reingest-sources" });
  replace(
    main,
    el("div", { class: "heading" }, el("h1", {}, "Refused")),
    el("p", { class: "muted" }, "Deliveries refused with 401 (signature) or 400 (malformed, no event id), kept with their body for keep_rejected. After fixing a secret, re-ingest them: each is verified again with the current secrets (its timestamp judged at the time it was received) and taken in through the same barrier as a delivery."),
    sources,
    planBox,
    el("div", { class: "scroll" }, el("table", { class: "list" }, el("thead", {}, el("tr", {}, ["Id", "Source", "Received", "Bytes", "Remote", "Reason"].map((h) => el("th", {}, h)))), tbody)),
    detail,
  );
  let shown = "";
  const load = async () => {
    const { data } = await api("/api/rejected");
    const rows = data || [];
    const key = JSON.stringify(rows);
    if (key === shown) return;
    shown = key;
    replace(
      tbody,
      rows.length
        ? rows.map((r) => {
            const open = el("a", { href: "#", class: "mono", dataset: { id: String(r.id) } }, `#${r.id}`);
            open.addEventListener("click", (e) => {
              e.preventDefault();
              openOne(detail, r.id);
            });
            return el("tr", { dataset: { id: String(r.id) } }, el("td", {}, open), el("td", {}, r.source), el("td", {}, time(r.received_at)), el("td", { class: "num" }, String(r.bytes)), el("td", { class: "mono" }, r.remote), el("td", { class: "reason" }, r.reason));
          })
        : el("tr", {}, el("td", { colspan: 6, class: "muted empty" }, "No refused deliveries kept.")),
    );
    const names = [...new Set(rows.map((r) => r.source))];
    replace(
      sources,
      names.map((name) => {
        const b = el("button", { type: "button", class: "primary reingest", dataset: { source: name } }, `Re-ingest ${name}…`);
        b.addEventListener("click", () => plan(planBox, name, load));
        return b;
      }),
    );
  };
  await load();
  let stopped = false;
  let timer = null;
  const loop = async () => {
    if (stopped) return;
    if (!document.hidden) {
      try {
        await load();
      } catch {
        // The next tick tries again; a 401 already shows the sign-in.
      }
    }
    if (!stopped) timer = setTimeout(loop, POLL_MS);
  };
  timer = setTimeout(loop, POLL_MS);
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

async function openOne(box, id) {
  try {
    const { data } = await api(`/api/rejected/${encodeURIComponent(id)}`);
    const headers = (data.headers || []).map(([name, value]) => el("tr", {}, el("th", {}, name), el("td", { class: "mono" }, value)));
    replace(
      box,
      el(
        "section",
        { class: "card", id: `refused-${data.id}` },
        el("h2", {}, `Refused #${data.id} · ${data.source}`),
        el("p", {}, "Received ", time(data.received_at), ` from ${data.remote} · ${data.bytes} bytes · `, el("span", { class: "error" }, data.reason)),
        el("h3", {}, "Headers"),
        el("table", { class: "kv" }, el("tbody", {}, headers)),
        el("h3", {}, "Body"),
        el("pre", { class: "payload" }, pretty(data.body)),
      ),
    );
  } catch (e) {
    replace(box, el("p", { class: "error" }, `Could not open #${id}: ${e.message}`));
  }
}

/** The dry run of a source's re-ingest, then a confirming click. */
async function plan(box, source, reload) {
  replace(box, el("p", { class: "muted" }, "Asking for the plan…"));
  let data;
  try {
    ({ data } = await api("/api/reingest", { method: "POST", body: { source, dry_run: true } }));
  } catch (e) {
    replace(box, el("p", { class: "error" }, `No plan: ${e.message}`));
    return;
  }
  const requests = data.requests || [];
  const passing = requests.filter((r) => r.passes).length;
  const items = requests.map((r) =>
    el(
      "li",
      {},
      el("span", { class: "mono" }, `#${r.id}`),
      " received ",
      time(r.received_at),
      ": ",
      r.passes ? [badge("ok"), ` would pass, with secret #${r.secret ?? "-"} (0-based)`] : [badge("failed"), " would not pass: ", r.reason],
    ),
  );
  const cancel = el("button", { type: "button", class: "quiet" }, "Cancel");
  cancel.addEventListener("click", () => replace(box));
  const buttons = el("div", { class: "buttons" });
  if (passing) {
    const confirm = el("button", { type: "button", class: "danger", id: "confirm-reingest" }, `Confirm: re-ingest ${passing} request${passing === 1 ? "" : "s"}`);
    confirm.addEventListener("click", async () => {
      confirm.disabled = true;
      cancel.disabled = true;
      try {
        const { data: done } = await api("/api/reingest", { method: "POST", body: { source, dry_run: false } });
        showDone(box, done);
        await reload();
      } catch (e) {
        replace(box, el("div", { class: "card plan" }, el("p", { class: "error" }, `Re-ingest failed: ${e.message}`)));
      }
    });
    buttons.append(confirm);
  }
  buttons.append(cancel);
  replace(
    box,
    el(
      "div",
      { class: "card plan", id: "reingest-plan" },
      el("h2", {}, `Re-ingest plan for ${source} (dry run: nothing has changed yet)`),
      requests.length ? el("ol", { class: "plan-steps" }, items) : el("p", {}, "Nothing kept."),
      buttons,
    ),
  );
}

function showDone(box, report) {
  const t = report.totals || {};
  const items = (report.requests || []).map((r) =>
    el(
      "li",
      {},
      el("span", { class: "mono" }, `#${r.id}`),
      ": ",
      r.passes
        ? (r.events || []).map((e) => [el("a", { href: eventPath(report.source, e.event_id), "data-link": true, class: "mono" }, e.event_id), " ", badge(e.outcome), " "])
        : [badge("failed"), " still refused: ", r.reason],
    ),
  );
  replace(
    box,
    el("div", { class: "card plan done", id: "reingest-result" }, el("h2", {}, `Re-ingested: ${t.accepted ?? 0} new, ${t.duplicate ?? 0} duplicate, ${t.failed ?? 0} still refused`), el("ul", {}, items)),
  );
}
