// Drives the operator dashboard (GET /) in headless Debian Chromium through playwright-core.
//
//   BASE=http://127.0.0.1:8080 TOKEN=<operator token> READER_TOKEN=<reader token> \
//     node tests/dashboard/dashboard.test.mjs
//
// Optional: STREAMLESS_BASE (a second server, started with --max-streams 0: the page must fall back
// to polling when the stream is refused with 429), REDRIVE_ID (the dead-lettered receipt to redrive; default the first dead letter),
// CHROMIUM (default /usr/bin/chromium), SCREENSHOT_DIR (writes a PNG of each view there),
// CPU_THROTTLE (slow the page down that many times, as on a loaded machine).
// The server must hold what tests/dashboard.rs seeds: at least 11 dead letters (two pages of
// 10), some of them `bulk-*`, a leased receipt, and `pending-3` (canceled by the test). Before
// the page opens, the script settles and fails `early-01` … `early-40` (so that the feed holds
// more entries than the page lists) and holds `held-1`; later it enqueues, claims and reports
// `live-1` … `live-4` (the operator token may) to watch the page follow GET /v1/history live.
// Exits 0 when every check passes, 1 with a message naming the failed step otherwise.
// tests/dashboard.rs starts the real binary, seeds it and runs this script.

import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { isDeepStrictEqual } from "node:util";
import { chromium } from "playwright-core";

// Every count card: the seven states, `scheduled` (pending receipts not due yet) and `held`
// (receipts an operator holds).
const STATES = ["pending", "scheduled", "held", "leased", "retry_scheduled", "settled", "skipped", "dead_lettered", "canceled"];
// How many entries "Latest outcomes" lists.
const LATEST_MAX = 50;
const BASE = (process.env.BASE || "").replace(/\/+$/, "");
const TOKEN = process.env.TOKEN || "";
const READER_TOKEN = process.env.READER_TOKEN || "";
const STREAMLESS_BASE = (process.env.STREAMLESS_BASE || "").replace(/\/+$/, "");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const SCREENSHOT_DIR = process.env.SCREENSHOT_DIR || "";
// CPU_THROTTLE=6 runs the page six times slower (Chromium's CPU throttling): a loaded machine.
const CPU_THROTTLE = Number(process.env.CPU_THROTTLE || "1");
const STEP_TIMEOUT_MS = 10_000;
// Generous: Chromium alone took over 30 s to start beside a loaded CI run.
const OVERALL_TIMEOUT_MS = 240_000;
const CHROMIUM_FLAGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-background-networking",
  "--disable-quic",
  "--no-first-run",
  "--disable-component-update",
  "--disable-sync",
];

let step = "start";
let passed = 0;
const started = Date.now();

function check(name) {
  step = name;
}

function ok(message) {
  passed += 1;
  console.log(`ok ${passed} - ${message} (${((Date.now() - started) / 1000).toFixed(1)} s)`);
}

async function api(method, urlPath, body) {
  let response;
  try {
    const headers = { Authorization: `Bearer ${TOKEN}`, Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    response = await fetch(BASE + urlPath, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (error) {
    throw new Error(`cannot reach ${BASE} (${method} ${urlPath}): ${error.cause?.message ?? error.message}`);
  }
  const text = await response.text();
  assert.ok(response.ok, `${method} ${urlPath} answered ${response.status}: ${text}`);
  return text ? JSON.parse(text) : null;
}

/** Poll `read` until `accept(value)` holds or the step times out; returns the last value. */
async function until(read, accept, timeoutMs = STEP_TIMEOUT_MS) {
  const deadline = Date.now() + timeoutMs;
  let value = await read();
  while (!accept(value) && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    value = await read();
  }
  return value;
}

async function pageCounts(page) {
  return page.$$eval(
    "#counts [data-state]",
    (cards, states) => {
      const out = {};
      for (const card of cards) {
        const state = card.getAttribute("data-state");
        if (!states.includes(state)) continue;
        const n = card.querySelector(".n");
        out[state] = n ? n.textContent.trim() : null;
      }
      return out;
    },
    STATES,
  );
}

function asNumbers(counts) {
  const out = {};
  for (const state of STATES) {
    const text = counts[state];
    out[state] = typeof text === "string" && /^\d+$/.test(text) ? Number(text) : text;
  }
  return out;
}

function apiNumbers(status) {
  const out = {};
  for (const state of STATES) out[state] = status.counts[state];
  return out;
}

/** The page's counts equal /v1/status (polled: the page refreshes every 2 s). */
async function countsMatch(page, label) {
  let api_ = null;
  const shown = await until(
    async () => {
      api_ = apiNumbers(await api("GET", "/v1/status?limit=1"));
      return asNumbers(await pageCounts(page));
    },
    (shown_) => JSON.stringify(shown_) === JSON.stringify(api_),
  );
  assert.deepEqual(shown, api_, `${label}: counts on the page differ from GET /v1/status`);
  return shown;
}

/** The ids of the list's rows, in order. */
async function listIds(page) {
  return page.$$eval("#receipts tr[data-receipt]", (rows) => rows.map((r) => r.getAttribute("data-receipt")));
}

/** The list shows exactly these receipts, in this order (polled). */
async function listMatches(page, receipts, label) {
  const want = receipts.map((r) => r.receipt_id);
  const shown = await until(() => listIds(page), (ids) => JSON.stringify(ids) === JSON.stringify(want));
  assert.deepEqual(shown, want, `${label}: rows differ from GET /v1/receipts`);
}

/** One row's cells by column key (a detail hash gives its full value). */
async function rowCells(page, id) {
  return page.$eval(`#receipts tr[data-receipt=${JSON.stringify(id)}]`, (row) => {
    const out = {};
    for (const td of row.querySelectorAll("td[data-col]")) {
      const hash = td.querySelector("[data-hash]");
      const code = td.querySelector("[data-code]");
      const rail = td.querySelector("[data-rail-code]");
      out[td.getAttribute("data-col")] = hash ? hash.getAttribute("data-hash") : code ? code.getAttribute("data-code") : td.textContent.trim();
      if (rail) out.rail_code = rail.getAttribute("data-rail-code");
    }
    return out;
  });
}

/** The receipt page shows what GET /v1/receipts/{id} answers (polled); returns the answer. */
async function receiptMatches(page, id) {
  let want = null;
  const read = async () => {
    want = await api("GET", `/v1/receipts/${encodeURIComponent(id)}`);
    return page.evaluate(() => {
      const facts = {};
      for (const dd of document.querySelectorAll("#receipt-facts dd[data-field]")) facts[dd.getAttribute("data-field")] = dd.getAttribute("data-value");
      return {
        id: document.querySelector("#receipt-id")?.textContent ?? null,
        facts,
        // Parsed, as the API's answer is (both round the same numbers; precise-1 checks digits).
        observation: (() => {
          const pre = document.querySelector("#receipt-observation");
          try { return pre ? JSON.parse(pre.textContent) : "(not shown)"; } catch { return "(not JSON)"; }
        })(),
        history: [...document.querySelectorAll("#timeline li[data-outcome]")].map((li) =>
          li.getAttribute("data-outcome") + (li.hasAttribute("data-retry-after-ms") ? " wait " + li.getAttribute("data-retry-after-ms") : "") +
            (li.hasAttribute("data-rail-code") ? " rail " + li.getAttribute("data-rail-code") : "")),
      };
    });
  };
  const expected = (r) => {
    const facts = { state: r.state, attempts: String(r.attempts), finalized_at: String(r.finalized_at), row_version: String(r.row_version) };
    const opt = (key, value) => { if (value !== null && value !== undefined) facts[key] = String(value); };
    opt("group", r.group);
    opt("priority", r.priority);
    opt("next_visible_at_ms", r.next_visible_at_ms);
    opt("held_at_ms", r.held_at_ms);
    opt("lease_owner", r.lease?.owner);
    opt("lease_until_ms", r.lease?.until_ms);
    opt("last_failure_code", r.last_failure?.code);
    opt("last_failure_rail_code", r.last_failure?.rail_code);
    opt("detail_sha256", r.last_failure?.detail_sha256);
    opt("dead_lettered_at_ms", r.dead_letter?.dead_lettered_at_ms);
    opt("dead_letter", r.dead_letter?.last_failure?.code ?? r.dead_letter?.code);
    opt("transcript_id", r.transcript_id);
    opt("skip_reason", r.skip_reason);
    opt("cancel_reason", r.cancel_reason);
    return {
      id: r.receipt_id,
      facts,
      observation: r.observation ?? null,
      history: r.history.map((h) => h.outcome + (h.retry_after_ms !== null && h.retry_after_ms !== undefined ? " wait " + h.retry_after_ms : "") +
        (h.rail_code ? " rail " + h.rail_code : "")),
    };
  };
  const shown = await until(read, (v) => isDeepStrictEqual(v, expected(want)));
  assert.deepEqual(shown, expected(want), `receipt page of ${id} differs from GET /v1/receipts/${id}`);
  return want;
}

/** Every entry of the feed, oldest first (the test's feed is small). */
async function wholeFeed() {
  const entries = [];
  let after = null;
  for (;;) {
    const page = await api("GET", "/v1/history?limit=1000" + (after ? "&after=" + encodeURIComponent(after) : ""));
    entries.push(...page.entries);
    if (!page.entries.length) return entries;
    after = page.next_cursor;
  }
}

/** What "Latest outcomes" lists: each entry's cursor, receipt and outcome, newest first. */
async function latestShown(page) {
  return page.$$eval("#latest li[data-receipt]", (items) =>
    items.map((li) => ({ cursor: li.getAttribute("data-cursor"), receipt_id: li.getAttribute("data-receipt"), outcome: li.getAttribute("data-outcome") })));
}

/** "Latest outcomes" lists the newest LATEST_MAX entries of the feed, newest first, each once (polled). */
async function latestMatchesFeed(page, label) {
  let want = null;
  const shown = await until(
    async () => {
      want = (await wholeFeed()).slice(-LATEST_MAX).reverse().map((e) => ({ cursor: e.cursor, receipt_id: e.receipt_id, outcome: e.outcome }));
      return latestShown(page);
    },
    (v) => isDeepStrictEqual(v, want),
  );
  assert.deepEqual(shown, want, `${label}: the latest outcomes differ from the newest ${LATEST_MAX} entries of GET /v1/history`);
  return shown;
}

/** Enqueue `id`, claim it and report `outcome`; answers the route. */
async function settleOne(id, finalizedAt, outcome) {
  await api("POST", "/v1/receipts", { receipt_id: id, finalized_at: finalizedAt, observation: { amount: 5 } });
  const claim = await api("POST", `/v1/receipts/${encodeURIComponent(id)}/claim`, { worker_id: "dashboard-early", lease_ms: 60_000 });
  return api("POST", `/v1/receipts/${encodeURIComponent(id)}/outcome`, { claim, outcome });
}

async function horizontalOverflow(page) {
  return page.evaluate(() => ({
    scrollWidth: document.documentElement.scrollWidth,
    bodyScrollWidth: document.body.scrollWidth,
    innerWidth: window.innerWidth,
  }));
}

async function main() {
  check("configuration");
  assert.ok(BASE, "set BASE to the server's base URL, e.g. BASE=http://127.0.0.1:8080");
  assert.ok(TOKEN, "set TOKEN to an operator token");
  assert.ok(READER_TOKEN, "set READER_TOKEN to a reader token");
  const origin = new URL(BASE).origin;

  check("seeded data");
  const letters = (await api("GET", "/v1/dead-letters?limit=100")).dead_letters;
  assert.ok(letters.length > 0, "the server holds no dead-lettered receipt to redrive");
  const target = process.env.REDRIVE_ID || letters[0].receipt_id;
  assert.ok(
    letters.some((l) => l.receipt_id === target),
    `REDRIVE_ID ${target} is not among the dead letters`,
  );

  check("whether the feed takes `before`");
  // With `before` the page fills its latest outcomes with one request, reading no page forward.
  const spec = await api("GET", "/openapi.json");
  const hasBefore = (spec.paths?.["/v1/history"]?.get?.parameters ?? []).some((p) => p.name === "before");
  assert.ok(hasBefore, "GET /v1/history takes `before`");
  ok("GET /v1/history takes before");

  check("outcomes and a hold before the page opens");
  // More entries than the page lists, so that it must find the newest ones; one of each route.
  const early = [];
  for (let i = 1; i <= 40; i++) {
    const id = `early-${String(i).padStart(2, "0")}`;
    const rail = { rail_code: i % 4 === 0 ? "card_declined" : "issuer_unavailable" };
    const outcome = i % 4 === 0 ? { kind: "permanent", code: "verification", detail: "declined (dashboard test)", ...rail }
      : i % 4 === 1 ? { kind: "retryable", code: "rpc", detail: "rail timed out (dashboard test)", ...rail }
      : { kind: "accepted", transcript_id: `tx-${id}` };
    const route = await settleOne(id, 1_764_461_000 + i, outcome);
    early.push([id, route.kind]);
  }
  const routes = new Set(early.map(([, kind]) => kind));
  assert.deepEqual([...routes].sort(), ["dead_lettered", "no_action", "retry_scheduled"], "the early outcomes took every route");
  await api("POST", "/v1/receipts", { receipt_id: "held-1", finalized_at: 1_764_461_100, observation: { amount: 6 } });
  const heldOne = await api("POST", "/v1/receipts/held-1/hold", { reason: "held before the page opened (dashboard test)" });
  assert.ok(heldOne.held_at_ms, "held-1 is held");
  const feedBefore = await wholeFeed();
  assert.ok(feedBefore.length > LATEST_MAX, `the feed holds ${feedBefore.length} entries, more than the page lists`);
  ok(`${early.length} outcomes reported and held-1 held before the page opened; the feed holds ${feedBefore.length} entries`);

  check("launch chromium");
  const profile = await mkdtemp(path.join(tmpdir(), "settled-dashboard-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_FLAGS,
    viewport: { width: 1280, height: 800 },
    timeout: 120_000,
  });
  let page = null;
  try {
    context.setDefaultTimeout(STEP_TIMEOUT_MS);
    page = context.pages()[0] || (await context.newPage());
    const foreign = [];
    const pageErrors = [];
    const feedRequests = [];
    page.on("request", (request) => {
      const url = request.url();
      if (url.startsWith(`${BASE}/v1/history?`)) feedRequests.push(url.slice(BASE.length));
      const { protocol } = new URL(url);
      if (protocol === "data:" || protocol === "blob:" || protocol === "about:") return;
      if (new URL(url).origin !== origin) foreign.push(url);
    });
    page.on("pageerror", (error) => pageErrors.push(error.message));
    if (CPU_THROTTLE > 1) {
      const cdp = await context.newCDPSession(page);
      await cdp.send("Emulation.setCPUThrottlingRate", { rate: CPU_THROTTLE });
    }
    ok(`chromium ${context.browser()?.version() ?? ""} started`);

    check("open the page");
    const response = await page.goto(`${BASE}/`, { waitUntil: "load" });
    assert.equal(response?.status(), 200, "GET / did not answer 200");
    assert.equal(await page.title(), "settled");
    ok("GET / loaded");

    check("enter the token");
    await page.locator("#token").fill(TOKEN);
    await page.locator('#token-form [type="submit"]').click();
    await page.locator('#counts [data-state="pending"] .n').waitFor({ state: "visible" });
    ok("token accepted, counts rendered");

    check("latest outcomes: filled from the feed on first load");
    await page.locator('#latest[data-filled="yes"]').waitFor();
    const firstLoad = await latestMatchesFeed(page, "first load");
    assert.equal(firstLoad.length, LATEST_MAX, "a full list");
    assert.deepEqual([firstLoad[0].receipt_id, firstLoad[0].outcome], ["held-1", "hold"], "the newest entry (the hold) first");
    assert.deepEqual([firstLoad[1].receipt_id, firstLoad[1].outcome], ["early-40", "permanent"], "then the newest outcome");
    const firstLink = page.locator("#latest li[data-receipt] a").first();
    assert.equal(await firstLink.getAttribute("href"), "#receipt=held-1", "each entry links to its receipt");
    const scans = feedRequests.filter((u) => u.includes("after=") && !u.includes("after=latest"));
    assert.ok(feedRequests.some((u) => u.includes("before=")), `the page asked for the entries before the tip: ${feedRequests.join(", ")}`);
    assert.deepEqual(scans, [], "with `before` the page reads no page of the feed forward");
    const early40Item = page.locator('#latest li[data-receipt="early-40"]');
    assert.equal(await early40Item.getAttribute("data-rail-code"), "card_declined", "early-40's rail code in the latest outcomes");
    assert.match(await early40Item.textContent(), /verification \(rail: card_declined\)/, "the rail code beside the failure code");
    ok(`the newest ${firstLoad.length} of ${feedBefore.length} entries listed on first load, newest first` +
      " (one `before` page)");

    check("counts match /v1/status");
    const status0 = await api("GET", "/v1/status?limit=1");
    const cards = await page.$$eval("#counts [data-state]", (all) => all.map((c) => c.getAttribute("data-state")));
    for (const state of STATES) assert.ok(cards.includes(state), `no card with data-state="${state}"`);
    const shown = await countsMatch(page, "after sign-in");
    assert.equal(status0.counts.held, 1, `GET /v1/status counts held-1 as held: ${JSON.stringify(status0.counts)}`);
    assert.equal(shown.held, 1, "the held card");
    ok(`counts match the API: ${JSON.stringify(shown)}, held-1 among them`);

    check("overview: groups, paused and resumed from the page");
    const groupRow = page.locator('#groups [data-group="default"]');
    await groupRow.waitFor({ state: "visible" });
    await groupRow.locator("[data-pause]").click();
    const paused = await until(() => api("GET", "/v1/groups/default"), (g) => g.paused === true);
    assert.equal(paused.paused, true, "Pause paused the group");
    await page.locator('#groups [data-group="default"] [data-pause]', { hasText: "Resume" }).waitFor();
    await page.locator('#groups [data-group="default"] [data-pause]').click();
    const resumed = await until(() => api("GET", "/v1/groups/default"), (g) => g.paused === false);
    assert.equal(resumed.paused, false, "Resume resumed the group");
    ok("the default group is listed; Pause and Resume took effect");

    check("overview: last hour charts match GET /v1/stats");
    const stats = await api("GET", "/v1/stats");
    const sums = {};
    for (const key of ["settled", "skipped", "retried", "dead_lettered", "enqueued", "conflicts"]) {
      sums[key] = String(stats.minutes.reduce((a, m) => a + m[key], 0));
    }
    const legend = () =>
      page.$$eval("#chart-throughput [data-series]", (items) =>
        Object.fromEntries(items.map((i) => [i.getAttribute("data-series"), i.querySelector(".v").textContent])),
      );
    const shownSums = await until(legend, (v) => isDeepStrictEqual(v, sums), 15_000);
    assert.deepEqual(shownSums, sums, "throughput totals differ from GET /v1/stats");
    assert.ok(Number(sums.dead_lettered) >= 2 && Number(sums.enqueued) >= 10, `stats saw the seeding: ${JSON.stringify(sums)}`);
    assert.ok((await page.locator("#chart-throughput svg rect").count()) > 0, "no bar drawn");
    const depths = stats.minutes.filter((m) => m.depth !== null).map((m) => m.depth);
    const depthShown = await page.locator('#chart-depth [data-series="depth"] .v').textContent();
    assert.equal(depthShown, depths.length ? String(depths[depths.length - 1]) : "no sample", "latest depth");
    const byCode = {};
    for (const [query, key] of [[`state=dead_lettered&finished_from_ms=${stats.now_ms - 3_600_000}`, "dead"], ["state=retry_scheduled", "retry"]]) {
      for (const r of (await api("GET", `/v1/receipts?${query}&limit=500`)).receipts) {
        const t = (byCode[r.last_failure.code] ||= { dead: 0, retry: 0 });
        t[key] += 1;
      }
    }
    const codesShown = await page.$$eval("#chart-failures [data-code]", (rows) =>
      Object.fromEntries(rows.map((r) => [r.getAttribute("data-code"), { dead: Number(r.getAttribute("data-dead")), retry: Number(r.getAttribute("data-retry")) }])),
    );
    assert.deepEqual(codesShown, byCode, "failures by code differ from GET /v1/receipts");
    // Axes: round y ticks up to at least the peak, and the hour's first and last minute.
    const peaks = {
      "#chart-throughput": Math.max(1, ...stats.minutes.map((m) => Math.max(m.settled + m.skipped + m.retried + m.dead_lettered, m.enqueued))),
      "#chart-depth": Math.max(1, ...depths),
    };
    const axes = {};
    for (const [chart, peak] of Object.entries(peaks)) {
      const axis = await page.$eval(`${chart} svg.chart`, (svg) => {
        const texts = (kind) => [...svg.querySelectorAll(`:scope > text[data-tick="${kind}"]`)].map((t) => t.textContent);
        return { y: texts("y"), start: texts("start"), end: texts("end") };
      });
      const ys = axis.y.map(Number);
      assert.ok(ys.length >= 1 && ys.every((v, i) => Number.isInteger(v) && v > 0 && (i === 0 || v > ys[i - 1])), `${chart}: y ticks ${axis.y}`);
      assert.ok(ys.at(-1) >= peak, `${chart}: the top tick ${ys.at(-1)} is below the peak ${peak}`);
      assert.equal(axis.start.length, 1, `${chart}: one start label`);
      assert.equal(axis.end.length, 1, `${chart}: one end label`);
      assert.match(axis.start[0], /^\d\d:\d\d$/, `${chart}: start label`);
      assert.match(axis.end[0], /^\d\d:\d\d UTC$/, `${chart}: end label`);
      const minutesOf = (hm) => Number(hm.slice(0, 2)) * 60 + Number(hm.slice(3, 5));
      const span = (minutesOf(axis.end[0]) - minutesOf(axis.start[0]) + 1440) % 1440;
      assert.equal(span, stats.minutes.length % 1440, `${chart}: ${axis.start[0]} to ${axis.end[0]} spans the minutes of GET /v1/stats`);
      axes[chart] = `${axis.y.join("/")} ${axis.start[0]}–${axis.end[0]}`;
    }
    ok(`charts: axes ${JSON.stringify(axes)}; throughput ${JSON.stringify(sums)}, depth ${depthShown}, failures ${JSON.stringify(byCode)}`);

    check("overview: live from the outcome feed");
    // Polling every 10 minutes: whatever changes within this step came through GET /v1/history.
    const POLL_MS = 600_000;
    await page.goto(`${BASE}/?poll=${POLL_MS}#overview`, { waitUntil: "load" });
    await page.locator('#live[data-live="live"]').waitFor();
    assert.equal((await page.locator("#live").textContent()).trim(), "live", "the live indicator");
    const beforeLive = await countsMatch(page, "before the live outcome");
    const liveStarted = Date.now();
    await api("POST", "/v1/receipts", { receipt_id: "live-1", finalized_at: 1_764_460_870, observation: { amount: 1 } });
    const liveClaim = await api("POST", "/v1/receipts/live-1/claim", { worker_id: "dashboard-live", lease_ms: 60_000 });
    await api("POST", "/v1/receipts/live-1/outcome", { claim: liveClaim, outcome: { kind: "accepted", transcript_id: "tx-live-1" } });
    const latest = page.locator('#latest li[data-receipt="live-1"]');
    await latest.waitFor();
    assert.equal(await latest.getAttribute("data-outcome"), "accepted", "the latest outcome of live-1");
    assert.equal(await latest.locator("a").getAttribute("href"), "#receipt=live-1", "the latest outcome links to its receipt");
    assert.equal(await page.locator("#latest li[data-receipt]").first().getAttribute("data-receipt"), "live-1", "newest first");
    const afterLive = await countsMatch(page, "after the live outcome");
    assert.equal(afterLive.settled, beforeLive.settled + 1, "settled after the live outcome");
    const liveMs = Date.now() - liveStarted;
    assert.ok(liveMs < POLL_MS, `the counts followed within ${liveMs} ms, sooner than the poll`);
    ok(`live: live-1's outcome listed and the counts followed in ${liveMs} ms (polling every ${POLL_MS / 1000} s)`);

    check("receipt page: refreshed live by its own outcome");
    await api("POST", "/v1/receipts", { receipt_id: "live-2", finalized_at: 1_764_460_871, observation: { amount: 2 } });
    const liveClaim2 = await api("POST", "/v1/receipts/live-2/claim", { worker_id: "dashboard-live", lease_ms: 60_000 });
    await page.evaluate(() => { location.hash = "#receipt=live-2"; });
    await receiptMatches(page, "live-2");
    await api("POST", "/v1/receipts/live-2/outcome", {
      claim: liveClaim2,
      outcome: { kind: "retryable", code: "rpc", detail: "rail busy (dashboard test)", retry_after_ms: 5000 },
    });
    const liveState = await until(() => page.locator("#receipt-state").textContent(), (s) => s === "retry_scheduled");
    assert.equal(liveState, "retry_scheduled", "live-2's page after its retryable outcome");
    await receiptMatches(page, "live-2");
    assert.equal(await page.locator('#latest li[data-receipt="live-2"]').getAttribute("data-outcome"), "retryable", "latest outcomes");
    ok("live-2's open page turned retry_scheduled with its new history entry, from the feed");

    check("live: the event-stream parser");
    const parsed = await page.evaluate(() => {
      const events = [];
      const feed = sseParser((e) => events.push(e));
      // Split anywhere, even inside a \r\n; comments, multi-line data, an event type.
      for (const chunk of [": keep-alive\n\nid: 0-1\r", "\ndata: {\"a\":", "1}\r\n\r\nid:0-2\ndata: one\ndata:two\n", "\nevent: error\ndata: gone\n\nid: 0-3\n\n"]) feed(chunk);
      return events;
    });
    assert.deepEqual(parsed, [
      { id: "0-1", event: "message", data: '{"a":1}' },
      { id: "0-2", event: "message", data: "one\ntwo" },
      { id: "0-2", event: "error", data: "gone" },
    ], "events parsed from text/event-stream");
    ok("the page's event-stream parser: ids, comments, multi-line data, CRLF split across chunks");

    check("live: reconnects after an error, resumes after the last id");
    const liveOutcome = async (id, finalizedAt) => {
      await api("POST", "/v1/receipts", { receipt_id: id, finalized_at: finalizedAt, observation: { amount: 3 } });
      const c = await api("POST", `/v1/receipts/${id}/claim`, { worker_id: "dashboard-live", lease_ms: 60_000 });
      await api("POST", `/v1/receipts/${id}/outcome`, { claim: c, outcome: { kind: "accepted", transcript_id: `tx-${id}` } });
    };
    await page.evaluate(() => { location.hash = "#overview"; });
    await page.locator("#latest").waitFor();
    // A stream silent for longer than the server's keep-alive allows counts as broken.
    await page.evaluate(() => { live.heardAt = 0; liveWatchdog(); });
    await page.locator('#live[data-live="reconnecting"]').waitFor();
    await page.locator('#live[data-live="live"]').waitFor();
    await page.evaluate(() => live.controller.abort());
    await page.locator('#live[data-live="reconnecting"]').waitFor();
    await liveOutcome("live-3", 1_764_460_872);
    await page.locator('#live[data-live="live"]').waitFor();
    await page.locator('#latest li[data-receipt="live-3"]').waitFor();
    // Stopped (as when the page hides) while an outcome commits: the restart resumes after the
    // last id received, so the entry arrives, once.
    await page.evaluate(() => liveStop());
    await liveOutcome("live-4", 1_764_460_873);
    await page.evaluate(() => liveStart());
    await page.locator('#latest li[data-receipt="live-4"]').waitFor();
    await page.locator('#live[data-live="live"]').waitFor();
    for (const id of ["live-1", "live-2", "live-3", "live-4"]) {
      assert.equal(await page.locator(`#latest li[data-receipt="${id}"]`).count(), 1, `${id} listed once`);
    }
    // Filled on load, then followed live: still exactly the newest entries, none twice, none missing.
    await latestMatchesFeed(page, "after the live outcomes");
    if (SCREENSHOT_DIR) {
      await page.evaluate(() => window.scrollTo(0, 0));
      await page.screenshot({ path: path.join(SCREENSHOT_DIR, "dashboard-overview.png") });
    }
    ok("a silent or broken stream shows reconnecting, then live; entries committed while it was away arrive once");
    await page.goto(`${BASE}/`, { waitUntil: "load" });

    check("receipts view: dead letters, 10 per page");
    await page.locator('nav a[data-view="receipts"]').click();
    await page.locator('#state-tabs [data-state="dead_lettered"][aria-pressed="true"]').waitFor();
    await page.locator("#f-limit").selectOption("10");
    await page.locator('#filter-form [type="submit"]').click();
    const first = await api("GET", "/v1/receipts?state=dead_lettered&limit=10");
    assert.ok(first.next_cursor, "the seeded dead letters fill more than one page of 10");
    await listMatches(page, first.receipts, "dead letters, page 1");
    const shownRow = await rowCells(page, first.receipts[0].receipt_id);
    const lf = first.receipts[0].last_failure;
    assert.equal(shownRow.code, lf.code, "code shown");
    assert.equal(shownRow.attempts, String(first.receipts[0].attempts), "attempts shown");
    assert.equal(shownRow.hash, lf.detail_sha256, "detail hash shown");
    assert.equal(shownRow.rail_code, lf.rail_code ?? undefined, "rail code shown beside the code");
    assert.equal(shownRow.rail_code, "card_declined", `${first.receipts[0].receipt_id}: the rail code`);
    assert.ok(shownRow.finished.length > 0, "dead-lettered time shown");
    ok(`dead-letter page 1 matches GET /v1/receipts: ${first.receipts.length} rows, code/attempts/hash/when shown`);

    check("receipts view: next page");
    if (SCREENSHOT_DIR) await page.screenshot({ path: path.join(SCREENSHOT_DIR, "dashboard-receipts.png") });
    await page.locator("#page-next").click();
    const second = await api("GET", `/v1/receipts?state=dead_lettered&limit=10&cursor=${encodeURIComponent(first.next_cursor)}`);
    await listMatches(page, second.receipts, "dead letters, page 2");
    await page.locator("#page-first").click();
    await listMatches(page, first.receipts, "dead letters, back to page 1");
    ok(`next page follows next_cursor: ${second.receipts.map((r) => r.receipt_id).join(", ")}`);

    check("receipts view: leased");
    await page.locator('#state-tabs [data-state="leased"]').click();
    const leased = await api("GET", "/v1/receipts?state=leased&limit=10");
    await listMatches(page, leased.receipts, "leased");
    const leasedRow = await rowCells(page, leased.receipts[0].receipt_id);
    assert.equal(leasedRow.owner, leased.receipts[0].lease.owner, "lease owner shown");
    assert.ok(leasedRow.deadline.length > 0, "lease deadline shown");
    ok(`leased rows show owner ${leasedRow.owner} and deadline ${leasedRow.deadline}`);

    check("receipts view: filter by id prefix");
    await page.locator('#state-tabs [data-state=""]').click();
    await page.locator("#f-prefix").fill("pending-");
    await page.locator('#filter-form [type="submit"]').click();
    const prefixed = await api("GET", "/v1/receipts?prefix=pending-&limit=10");
    await listMatches(page, prefixed.receipts, "prefix pending-");
    await page.locator("#f-reset").click();
    await page.locator("#f-limit").selectOption("50");
    await page.locator('#state-tabs [data-state="dead_lettered"]').click();
    const rowsSelector = "#receipts tr[data-receipt]";
    await listMatches(page, (await api("GET", "/v1/receipts?state=dead_lettered&limit=50")).receipts, "dead letters, 50 per page");
    ok(`prefix filter shows ${prefixed.receipts.map((r) => r.receipt_id).join(", ")}`);

    check("an operator token shows the actions");
    await page.locator("body.can-act").waitFor({ state: "attached" });
    assert.ok(await page.locator("#bulk-bar").isVisible(), "the bulk actions are hidden for an operator");
    ok("operator: row and bulk actions shown");

    check(`redrive ${target}: dry run, then confirm`);
    const row = page.locator(`${rowsSelector}[data-receipt=${JSON.stringify(target)}]`);
    assert.equal(await row.count(), 1, `no dead-letter row for ${target}`);
    await row.locator('button[data-action="redrive"]').click();
    await page.locator("#confirm").waitFor({ state: "visible" });
    await page.locator("#confirm-done").waitFor({ state: "visible" });
    assert.equal(await page.locator("#confirm-done").textContent(), "1", "the dry run would change one receipt");
    assert.equal((await api("GET", `/v1/receipts/${encodeURIComponent(target)}`)).state, "dead_lettered", "the dry run changed nothing");
    await page.locator("#confirm-go").click();
    await page.locator("#confirm-result").waitFor({ state: "visible" });
    await page.locator("#confirm-close").click();
    await row.waitFor({ state: "detached" });
    const redriven = await api("GET", `/v1/receipts/${encodeURIComponent(target)}`);
    assert.equal(redriven.state, "pending", `${target} after redrive`);
    assert.equal(redriven.attempts, 0, `${target} attempts after redrive`);
    // The row stays gone (no stale refresh brings it back) and the counts follow.
    const stays = await until(() => row.count(), (n) => n !== 0, 2_500);
    assert.equal(stays, 0, `the row for ${target} came back after the redrive`);
    const after = await countsMatch(page, "after redrive");
    assert.equal(after.dead_lettered, shown.dead_lettered - 1, "dead_lettered count after redrive");
    assert.equal(await page.locator("#error").isHidden(), true, "an error is shown after redrive");
    ok(`redrive through its dry run removed the row; ${target} is pending with attempts 0`);

    check("bulk redrive of the filtered selection");
    await page.locator("#f-prefix").fill("bulk-");
    await page.locator('#filter-form [type="submit"]').click();
    const bulkPage = await api("GET", "/v1/receipts?state=dead_lettered&prefix=bulk-&limit=50");
    await listMatches(page, bulkPage.receipts, "dead letters with prefix bulk-");
    const selected = bulkPage.receipts.length;
    assert.ok(selected >= 2, "seeded bulk-* dead letters");
    await page.locator('#bulk-bar [data-bulk="redrive"]').click();
    await page.locator("#confirm-done").waitFor({ state: "visible" });
    assert.equal(await page.locator("#confirm-matched").textContent(), String(selected), "dry run: matched");
    assert.equal(await page.locator("#confirm-done").textContent(), String(selected), "dry run: would change");
    const untouched = await api("GET", "/v1/receipts?state=dead_lettered&prefix=bulk-&limit=50");
    assert.equal(untouched.receipts.length, selected, "the dry run changed nothing");
    if (SCREENSHOT_DIR) await page.screenshot({ path: path.join(SCREENSHOT_DIR, "dashboard-confirm.png") });
    await page.locator("#confirm-go").click();
    await page.locator("#confirm-result").waitFor({ state: "visible" });
    await page.locator("#confirm-close").click();
    await listMatches(page, [], "dead letters with prefix bulk- after the bulk redrive");
    const moved = await api("GET", "/v1/receipts?state=pending&prefix=bulk-&limit=50");
    assert.equal(moved.receipts.length, selected, "every bulk-* receipt is pending after the bulk redrive");
    assert.ok(moved.receipts.every((r) => r.attempts === 0), "attempts reset by the redrive");
    ok(`bulk redrive: dry run showed ${selected}, confirmed, ${moved.receipts.length} receipts pending`);

    check("cancel needs a reason");
    await page.locator("#f-reset").click();
    await page.locator('#state-tabs [data-state="pending"]').click();
    const cancelRow = page.locator(`${rowsSelector}[data-receipt="pending-3"]`);
    await cancelRow.locator('button[data-action="cancel"]').click();
    await page.locator("#confirm").waitFor({ state: "visible" });
    await page.locator("#confirm-dry").click();
    await page.locator("#confirm-error").waitFor({ state: "visible" });
    assert.equal(await page.locator("#confirm-go").isDisabled(), true, "confirm without a reason");
    await page.locator("#confirm-reason").fill("duplicate of pending-1 (dashboard test)");
    await page.locator("#confirm-dry").click();
    await until(() => page.locator("#confirm-go").isEnabled(), (v) => v);
    await page.locator("#confirm-go").click();
    await page.locator("#confirm-result").waitFor({ state: "visible" });
    await page.locator("#confirm-close").click();
    await cancelRow.waitFor({ state: "detached" });
    const canceled = await api("GET", "/v1/receipts/pending-3");
    assert.equal(canceled.state, "canceled", "pending-3 after cancel");
    assert.equal(canceled.cancel_reason, "duplicate of pending-1 (dashboard test)", "cancel reason");
    ok("cancel: refused without a reason; with one, pending-3 is canceled");

    check("a selection that changes after its dry run is refused");
    await page.locator("#f-prefix").fill("pending-");
    await page.locator('#filter-form [type="submit"]').click();
    const before = (await api("GET", "/v1/receipts?state=pending&prefix=pending-&limit=50")).receipts;
    await listMatches(page, before, "pending receipts with prefix pending-");
    await page.locator('#bulk-bar [data-bulk="hold"]').click();
    await page.locator("#confirm-matched").waitFor({ state: "visible" });
    assert.equal(await page.locator("#confirm-matched").textContent(), String(before.length), "dry run: matched");
    await api("POST", "/v1/receipts", { receipt_id: "pending-4", finalized_at: 1_764_460_803, observation: { amount: 7 } });
    await page.locator("#confirm-go").click();
    await page.locator("#confirm-error").waitFor({ state: "visible" });
    assert.match(await page.locator("#confirm-error").textContent(), /count_mismatch/, "the refusal names count_mismatch");
    const notHeld = (await api("GET", "/v1/receipts?held=true&prefix=pending-&limit=50")).receipts;
    assert.deepEqual(notHeld, [], "nothing was held");
    await page.locator("#confirm-close").click();
    await page.locator("#f-reset").click();
    ok(`hold of ${before.length} refused after a receipt joined the selection (409 count_mismatch); nothing held`);

    check(`receipt page of ${target}, opened from its link`);
    await page.goto(`${BASE}/#receipt=${encodeURIComponent(target)}`, { waitUntil: "load" });
    await receiptMatches(page, target);
    const link = await page.locator("#receipt-link").getAttribute("href");
    assert.ok(link.endsWith(`#receipt=${encodeURIComponent(target)}`), `shareable link: ${link}`);
    const outcomes = await page.$$eval("#timeline li[data-outcome]", (items) => items.map((i) => i.getAttribute("data-outcome")));
    assert.ok(outcomes.includes("permanent") && outcomes.includes("redrive"), `history: ${outcomes}`);
    ok(`#receipt=${target} opens on load: state, facts and timeline ${outcomes.join(" → ")} match the API`);

    check("receipt page: an observation's numbers as stored");
    await page.locator("#lookup-id").fill("precise-1");
    await page.locator('#lookup-form [type="submit"]').click();
    await receiptMatches(page, "precise-1");
    const observed = await page.locator("#receipt-observation").textContent();
    for (const digits of ["123456789012345678901", "0.1000000000000000055511151231257827"]) {
      assert.ok(observed.includes(digits), `the observation shows ${digits}: ${observed}`);
    }
    ok("precise-1: the observation keeps every digit the server stored");

    check("receipt page: the rail's retry_after_ms in the timeline");
    await page.locator("#lookup-id").fill("retry-2");
    await page.locator('#lookup-form [type="submit"]').click();
    const retry2 = await receiptMatches(page, "retry-2");
    assert.equal(retry2.history.at(-1).retry_after_ms, 5000, "the seeded retry_after_ms");
    const waitItem = page.locator('#timeline li[data-outcome="retryable"][data-retry-after-ms="5000"]');
    assert.equal(await waitItem.count(), 1, "the retryable entry carries retry_after_ms 5000");
    assert.match(await waitItem.textContent(), /wait 5000 ms/, "the timeline says the rail's wait");
    ok("retry-2: the timeline shows the rail's wait of 5000 ms");

    check("receipt page: the rail's own code beside the failure code");
    await page.locator("#lookup-id").fill("early-40");
    await page.locator('#lookup-form [type="submit"]').click();
    const early40 = await receiptMatches(page, "early-40");
    assert.equal(early40.last_failure.rail_code, "card_declined", "the API's last_failure.rail_code");
    assert.equal(await page.locator('#receipt-facts dd[data-field="last_failure_rail_code"]').textContent(), "card_declined", "the rail code fact");
    assert.match(await page.locator('#receipt-facts dd[data-field="dead_letter"]').textContent(), /rail: card_declined/, "the dead letter's rail code");
    assert.equal(await page.locator('#timeline li[data-outcome="permanent"][data-rail-code="card_declined"]').count(), 1, "the timeline's rail code");
    ok("early-40: the rail code card_declined beside verification in its facts, dead letter and timeline");

    check("receipt page: lease holder, failure detail hash, observation");
    await page.locator("#lookup-id").fill("leased-1");
    await page.locator('#lookup-form [type="submit"]').click();
    const leasedView = await receiptMatches(page, "leased-1");
    assert.ok(leasedView.lease, "leased-1 has a lease");
    await page.locator('nav a[data-view="receipts"]').click();
    await page.locator('#state-tabs [data-state="dead_lettered"]').click();
    await page.locator('#receipts tr[data-receipt="dead-1"] a[data-receipt-link]').click();
    const deadView = await receiptMatches(page, "dead-1");
    assert.ok(deadView.last_failure && deadView.dead_letter, "dead-1 has its failure and dead letter");
    if (SCREENSHOT_DIR) await page.screenshot({ path: path.join(SCREENSHOT_DIR, "dashboard-receipt.png") });
    await page.goBack();
    await page.locator("#receipts-table").waitFor({ state: "visible" });
    ok("leased-1 shows its lease holder and deadline; dead-1 its failure hash and dead letter; a list link opens the page");

    check("the badge names the token's role and name from GET /v1/info");
    await page.locator("#role").filter({ hasText: "operator alice: may act" }).waitFor();
    ok("the operator token is shown as operator alice, allowed to act");

    check("a reader token sees no action");
    await page.locator("#token").fill(READER_TOKEN);
    await page.locator('#token-form [type="submit"]').click();
    await page.locator("#role").filter({ hasText: "reader: read-only" }).waitFor();
    await page.locator('#state-tabs [data-state="dead_lettered"]').click();
    const forReader = (await api("GET", "/v1/receipts?state=dead_lettered&limit=50")).receipts;
    assert.ok(forReader.length > 0, "a dead letter is left to show");
    await listMatches(page, forReader, "dead letters, reader token");
    assert.equal(await page.locator(".act:visible").count(), 0, "action controls visible to a reader token");
    assert.equal(await page.locator("#error").isHidden(), true, "an error is shown to a reader");
    await page.locator('#live[data-live="live"]').waitFor();
    ok(`reader: ${forReader.length} dead letters listed, no action button; the feed is live`);
    await page.locator("#token").fill(TOKEN);
    await page.locator('#token-form [type="submit"]').click();
    await page.locator("body.can-act").waitFor({ state: "attached" });

    check("hold and unhold from the receipt page");
    await page.goto(`${BASE}/#receipt=pending-1`, { waitUntil: "load" });
    await receiptMatches(page, "pending-1");
    await page.locator('#receipt-actions [data-action="hold"]').click();
    await page.locator("#confirm-done").waitFor({ state: "visible" });
    assert.equal(await page.locator("#confirm-done").textContent(), "1", "the dry run would hold one receipt");
    await page.locator("#confirm-reason").fill("merchant dispute (dashboard test)");
    await page.locator("#confirm-go").click();
    await page.locator("#confirm-result").waitFor({ state: "visible" });
    await page.locator("#confirm-close").click();
    const held = await receiptMatches(page, "pending-1");
    assert.ok(held.held_at_ms, "pending-1 is held");
    assert.equal(held.history.at(-1).note, "merchant dispute (dashboard test)", "hold reason in history");
    assert.equal(held.history.at(-1).actor, "alice", "the operator token's name in history");
    await page.locator('#receipt-actions [data-action="unhold"]').click();
    await page.locator("#confirm-done").waitFor({ state: "visible" });
    await page.locator("#confirm-go").click();
    await page.locator("#confirm-result").waitFor({ state: "visible" });
    await page.locator("#confirm-close").click();
    const unheld = await receiptMatches(page, "pending-1");
    assert.equal(unheld.held_at_ms ?? null, null, "pending-1 is no longer held");
    ok("pending-1 held (reason and actor in its history) and unheld, each through its dry run");

    // Each view, laptop then phone: no horizontal overflow; a screenshot of each at 1280x800.
    const views = [
      ["overview", "#overview", "#chart-throughput svg"],
      ["receipts", "#receipts", "#receipts-table"],
      ["receipt", "#receipt=dead-1", "#timeline"],
    ];
    for (const [width, height] of [[1280, 800], [390, 844]]) {
      check(`layout at ${width}x${height}`);
      await page.setViewportSize({ width, height });
      for (const [name, hash, ready] of views) {
        await page.goto(`${BASE}/${hash}`, { waitUntil: "load" });
        await page.locator(ready).first().waitFor({ state: "visible" });
        await page.evaluate(() => new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve))));
        const size = await horizontalOverflow(page);
        assert.ok(size.scrollWidth <= size.innerWidth, `${name}: horizontal overflow at ${width} px: ${JSON.stringify(size)}`);
        if (SCREENSHOT_DIR && width === 390 && name === "receipts") {
          await page.evaluate(() => window.scrollTo(0, 0));
          await page.screenshot({ path: path.join(SCREENSHOT_DIR, "dashboard-phone.png") });
        }
      }
      ok(`no horizontal overflow at ${width}x${height} in ${views.map((v) => v[0]).join(", ")}`);
    }

    check("offline");
    assert.deepEqual(foreign, [], `the page made requests to hosts other than ${origin}`);
    assert.deepEqual(pageErrors, [], "uncaught errors in the page");
    ok(`every request went to ${origin}; no uncaught page errors`);

    if (STREAMLESS_BASE) {
      check("streams refused (429): the page polls instead");
      await page.setViewportSize({ width: 1280, height: 800 });
      await page.goto(`${STREAMLESS_BASE}/`, { waitUntil: "load" });
      await page.locator("#token").fill(TOKEN);
      await page.locator('#token-form [type="submit"]').click();
      await page.locator('#live[data-live="polling"]').waitFor();
      const pending = () => page.locator('#counts [data-state="pending"] .n').textContent().then((t) => Number(t.trim()));
      const before = await pending();
      const enqueued = await fetch(`${STREAMLESS_BASE}/v1/receipts`, {
        method: "POST",
        headers: { Authorization: `Bearer ${TOKEN}`, "Content-Type": "application/json" },
        body: JSON.stringify({ receipt_id: "polled-1", finalized_at: 1_764_460_880 }),
      });
      assert.equal(enqueued.status, 201, "enqueue on the streamless server");
      const after = await until(pending, (n) => n === before + 1);
      assert.equal(after, before + 1, "the pending count followed by polling");
      assert.match((await page.locator("#live").textContent()).trim(), /polling/, "the live indicator says it polls");
      ok("with streams refused the page shows it polls and its counts still follow");
    }
  } catch (error) {
    if (page) {
      const shot = path.join(tmpdir(), "dashboard-failure.png");
      await page.screenshot({ path: shot, fullPage: true }).then(
        () => console.error(`screenshot of the failure: ${shot}`),
        () => {},
      );
    }
    throw error;
  } finally {
    await context.close().catch(() => {});
    await rm(profile, { recursive: true, force: true }).catch(() => {});
  }
}

const timer = setTimeout(() => {
  console.error(`FAIL (${step}): the dashboard test took longer than ${OVERALL_TIMEOUT_MS / 1000} s`);
  process.exit(1);
}, OVERALL_TIMEOUT_MS);
timer.unref();

try {
  await main();
  console.log(`dashboard test: all ${passed} checks passed`);
  process.exit(0);
} catch (error) {
  console.error(`FAIL (${step}): ${error && error.message ? error.message : error}`);
  process.exit(1);
}
