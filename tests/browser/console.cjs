// The web console in Debian's Chromium, driven by Playwright (playwright-core:
// no browser download). Run by tests/it/console.rs, which starts delayline,
// binds a consumer and checks afterwards, through the API and the consumer,
// what this script did in the browser. CommonJS, so that NODE_PATH finds the
// tests' npm packages.
//
// Environment: BASE (the API's address), OPS_TOKEN (every permission),
// VIEWER_TOKEN (read only), DEST (a bound destination), NOWHERE (a destination
// nothing binds), SHOTS (the folder screenshots go to), CHROMIUM.
// Prints one JSON line of what it saw; exits 1 with the reason otherwise.

const { chromium } = require("playwright-core");
const assert = require("node:assert/strict");
const path = require("node:path");

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const BASE = env("BASE");
const OPS = env("OPS_TOKEN");
const VIEWER = env("VIEWER_TOKEN");
const DEST = env("DEST");
const NOWHERE = env("NOWHERE");
const SHOTS = env("SHOTS");
const seen = {};

async function api(method, route, body) {
  const response = await fetch(BASE + route, {
    method,
    headers: { authorization: `Bearer ${OPS}`, "content-type": "application/json" },
    body: body && JSON.stringify(body),
  });
  const text = await response.text();
  assert.ok(response.status < 300, `${method} ${route}: ${response.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

async function shot(page, name) {
  await page.screenshot({ path: path.join(SHOTS, `${name}.png`), fullPage: name === "overview" });
}

// WCAG 2.1 contrast ratio of every element's own text against the
// background it is drawn on, and a name for every control.
async function accessible(page, where) {
  const problems = await page.evaluate(() => {
    const rgba = (text) => (text.match(/[\d.]+/g) || []).map(Number);
    const luminance = ([r, g, b]) => {
      const channel = (c) => {
        c /= 255;
        return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
      };
      return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b);
    };
    const background = (element) => {
      for (let e = element; e; e = e.parentElement) {
        const [r, g, b, a = 1] = rgba(getComputedStyle(e).backgroundColor);
        if (a > 0) return [r, g, b];
      }
      return [255, 255, 255];
    };
    const found = [];
    for (const element of document.querySelectorAll("body *")) {
      const ownText = [...element.childNodes].some(
        (n) => n.nodeType === Node.TEXT_NODE && n.textContent.trim() !== "",
      );
      if (!ownText || element.offsetParent === null) continue;
      const fore = luminance(rgba(getComputedStyle(element).color));
      const back = luminance(background(element));
      const ratio = (Math.max(fore, back) + 0.05) / (Math.min(fore, back) + 0.05);
      if (ratio < 4.5) found.push(`contrast ${ratio.toFixed(2)}: ${element.outerHTML.slice(0, 80)}`);
    }
    for (const control of document.querySelectorAll("input:not([type=hidden]), select, textarea")) {
      if (control.labels.length === 0 && !control.getAttribute("aria-label")) {
        found.push(`no label: ${control.outerHTML.slice(0, 80)}`);
      }
    }
    for (const button of document.querySelectorAll("button, a")) {
      if ((button.getAttribute("aria-label") || button.textContent).trim() === "") {
        found.push(`no name: ${button.outerHTML.slice(0, 80)}`);
      }
    }
    return found;
  });
  assert.deepEqual(problems, [], `${where}: accessibility`);
}

// Nothing wider than a phone's screen: no sideways scrolling of the page.
async function fitsNarrow(page, where) {
  const [scroll, width] = await page.evaluate(() => [
    document.documentElement.scrollWidth,
    document.documentElement.clientWidth,
  ]);
  assert.ok(scroll <= width + 1, `${where}: ${scroll}px wide on a ${width}px screen`);
}

// Signs in with the keyboard alone: Tab to the token field, type, Enter.
async function signIn(browser, token, viewport) {
  const context = await browser.newContext({ viewport });
  const page = await context.newPage();
  page.on("dialog", (dialog) => {
    seen.confirmations = (seen.confirmations || 0) + 1;
    dialog.accept();
  });
  // The console's Content-Security-Policy must block nothing it serves.
  page.on("console", (message) => {
    if (message.type() === "error" && /Content Security Policy/i.test(message.text())) {
      cspViolations.push(message.text());
    }
  });
  await page.goto(`${BASE}/console`);
  assert.match(page.url(), /\/console\/login$/);
  for (let i = 0; i < 12; i++) {
    if (await page.evaluate(() => document.activeElement?.id === "token")) break;
    await page.keyboard.press("Tab");
  }
  assert.equal(await page.evaluate(() => document.activeElement?.id), "token", "Tab reaches the token field");
  await page.keyboard.type(token);
  await page.keyboard.press("Enter");
  await page.waitForURL(`${BASE}/console`);
  return page;
}

async function levelCounts(page) {
  return page.$$eval("td[id^=n-]", (cells) => cells.map((c) => c.textContent).join(","));
}

// When the overview's 40 tasks were posted (due 20 to 59 s after it).
let postedAt = 0;

async function overviewAndChart(browser, page) {
  const wrong = await (await browser.newContext()).newPage();
  await wrong.goto(`${BASE}/console/login`);
  await wrong.getByLabel("Token").fill("not-a-token");
  await wrong.getByRole("button", { name: "Sign in" }).click();
  assert.match(await wrong.locator("[role=alert]").innerText(), /not known/);
  await shot(wrong, "login");

  await accessible(page, "overview");
  const before = await levelCounts(page);
  // Tasks flow while the page stays open: its chart must follow by itself.
  const tasks = Array.from({ length: 40 }, (_, i) => ({
    destination: DEST,
    delay: `${20 + i}s`,
    payload: { flow: i },
  }));
  await api("POST", "/v1/tasks/batch", { tasks });
  const started = Date.now();
  let after = before;
  while (after === before && Date.now() - started < 30000) {
    await page.waitForTimeout(500);
    after = await levelCounts(page);
  }
  assert.notEqual(after, before, "the level chart moved without a reload");
  seen.chart = { before, after, ms: Date.now() - started };
  postedAt = started;
  await shot(page, "overview");
}

// The overview's forecast counts the tasks just posted; the Limits page
// pauses and resumes a limit, and says why it holds.
async function forecastAndLimits(page) {
  await page.goto(`${BASE}/console`);
  const charts = page.locator("svg.forecast");
  assert.ok((await charts.count()) >= 1, "a forecast chart on the overview");
  const label = await charts.first().getAttribute("aria-label");
  const total = Number((label.match(/: (\d+) tasks/) || [])[1]);
  // Posted due in 20 to 59 s: those not yet due (a second's margin) count.
  const elapsed = (Date.now() - postedAt) / 1000;
  const stillDue = Array.from({ length: 40 }, (_, i) => 20 + i).filter((s) => s > elapsed + 1).length;
  assert.ok(total >= stillDue, `the next hour's chart counts the ${stillDue} tasks posted and not yet due: ${label}`);
  assert.ok((await charts.first().locator("rect title").count()) >= 1, "each bar names its count");
  seen.forecast_next_hour = total;

  const name = "b-pace";
  await api("PUT", `/v1/limits/${name}`, { destinations: `${DEST}-paced`, rate_per_sec: 5 });
  await page.getByRole("link", { name: "Limits" }).click();
  const row = page.locator("tbody tr", { hasText: name });
  assert.match(await row.innerText(), /5\/s, burst 1/);
  assert.match(await row.innerText(), /nothing held/);
  await page.getByRole("button", { name: `pause ${name}` }).click();
  await page.getByRole("button", { name: `resume ${name}` }).waitFor();
  assert.match(await row.innerText(), /paused until resumed/);
  await accessible(page, "limits");
  await shot(page, "limits");
  await page.getByRole("button", { name: `resume ${name}` }).click();
  await page.getByRole("button", { name: `pause ${name}` }).waitFor();
  assert.doesNotMatch(await row.innerText(), /paused/);
  seen.limit_paused_and_resumed = (await api("GET", `/v1/limits/${name}`)).paused === false;
  await api("DELETE", `/v1/limits/${name}`);
}

async function findAndFilter(page) {
  await page.getByRole("link", { name: "Tasks" }).click();
  await page.getByLabel("Task id").fill("b-move");
  await page.getByLabel("Task id").press("Enter");
  await page.waitForURL(/\/console\/tasks\/b-move$/);
  assert.match(await page.locator("h1").innerText(), /b-move/);

  await page.goto(`${BASE}/console/tasks`);
  await page.getByLabel("Destination").fill(DEST);
  await page.getByLabel("State").selectOption("scheduled");
  await page.getByRole("button", { name: "Filter" }).click();
  const rows = await page.$$eval("tbody tr", (trs) =>
    trs.map((tr) => [...tr.querySelectorAll("td")].map((td) => td.textContent)),
  );
  assert.ok(rows.length >= 2, `filtered rows: ${JSON.stringify(rows)}`);
  for (const [, state, destination] of rows) {
    assert.equal(state, "scheduled");
    assert.equal(destination, DEST);
  }
  seen.filtered = rows.length;
  await accessible(page, "tasks");
  await shot(page, "tasks");
}

// Cancels b-cancel with the keyboard (Tab to the button, Enter, confirm).
async function cancelByKeyboard(page) {
  // Due soon, beside one left alone: the test waits for that one, then
  // checks this one never came.
  for (const id of ["b-cancel", "b-control"]) {
    await api("POST", "/v1/tasks", { id, destination: DEST, delay: "10s", payload: { id } });
  }
  await page.goto(`${BASE}/console/tasks/b-cancel`);
  for (let i = 0; i < 30; i++) {
    const focused = await page.evaluate(() => document.activeElement?.textContent);
    if (focused === "Cancel task") break;
    await page.keyboard.press("Tab");
  }
  const asked = seen.confirmations || 0;
  await page.keyboard.press("Enter");
  await page.waitForURL(/done=/);
  assert.equal(seen.confirmations, asked + 1, "the cancel asked for a confirmation");
  assert.match(await page.locator("[role=status]").innerText(), /cancelled/);
  assert.match(await page.locator("p", { hasText: "State:" }).innerText(), /State: cancelled/);
  assert.equal(await page.getByRole("button", { name: "Cancel task" }).count(), 0);
}

async function reschedule(page) {
  await page.goto(`${BASE}/console/tasks/b-move`);
  await page.getByLabel("Due in").fill("nonsense");
  await page.getByRole("button", { name: "Reschedule" }).click();
  await page.waitForURL(/error=/);
  assert.match(await page.locator("[role=status]").innerText(), /^invalid_delay: /);

  await page.getByLabel("Due in").fill("2h");
  await page.getByRole("button", { name: "Reschedule" }).click();
  await page.waitForURL(/done=/);
  const notice = await page.locator("[role=status]").innerText();
  const due = notice.match(/moved: due (\S+)/);
  assert.ok(due, notice);
  seen.moved_due = due[1];
  const timeline = await page.locator("ol").innerText();
  assert.ok(timeline.includes(`${due[1]}: due`), timeline);
  await accessible(page, "task");
  await shot(page, "task");
}

async function schedulesAndProblems(page) {
  await page.getByRole("link", { name: "Schedules" }).click();
  await page.getByRole("button", { name: "pause b-every" }).click();
  await page.waitForURL(`${BASE}/console/schedules`);
  assert.match(await page.locator("tbody tr", { hasText: "b-every" }).innerText(), /paused/);
  seen.paused = true;
  await accessible(page, "schedules");
  await shot(page, "schedules");

  await page.getByRole("link", { name: "Problems" }).click();
  const started = Date.now();
  while (!(await page.locator("tbody tr", { hasText: "b-nowhere" }).count())) {
    assert.ok(Date.now() - started < 20000, "b-nowhere listed as unroutable");
    await page.waitForTimeout(500);
    await page.reload();
  }
  await page.getByRole("button", { name: "Requeue unroutable messages" }).click();
  await page.waitForURL(/done=/);
  seen.requeued = await page.locator("[role=status]").innerText();
  assert.match(seen.requeued, /^requeued \d+ messages; \d+ still unroutable$/);
  await accessible(page, "problems");
  await shot(page, "problems");
}

// The viewer (read only) sees no cancel button, and a hand-made form is refused.
async function viewerCannotCancel(browser) {
  const page = await signIn(browser, VIEWER, { width: 1000, height: 800 });
  await page.goto(`${BASE}/console/tasks/b-keep`);
  assert.equal(await page.getByRole("button", { name: "Cancel task" }).count(), 0);
  assert.equal(await page.getByRole("button", { name: "Reschedule" }).count(), 0);
  const refused = await page.evaluate(async () => {
    const csrf = document.querySelector("input[name=csrf]").value;
    const response = await fetch("/console/tasks/b-keep/cancel", {
      method: "POST",
      body: new URLSearchParams({ csrf }),
      redirect: "manual",
    });
    return [response.status, await response.text()];
  });
  assert.equal(refused[0], 403, refused[1]);
  assert.match(refused[1], /<code>forbidden<\/code>: /);
  seen.viewer_refused = refused[1];
}

async function narrowScreens(browser) {
  const page = await signIn(browser, OPS, { width: 360, height: 740 });
  for (const route of ["/console", "/console/tasks", "/console/tasks/b-move", "/console/schedules", "/console/limits", "/console/problems"]) {
    await page.goto(BASE + route);
    await fitsNarrow(page, route);
  }
  await page.goto(`${BASE}/console/tasks/b-move`);
  await shot(page, "task-narrow");
}

const cspViolations = [];

async function main() {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  try {
    const page = await signIn(browser, OPS, { width: 1100, height: 800 });
    await overviewAndChart(browser, page);
    await forecastAndLimits(page);
    await findAndFilter(page);
    await cancelByKeyboard(page);
    await reschedule(page);
    await schedulesAndProblems(page);
    await viewerCannotCancel(browser);
    await narrowScreens(browser);
    assert.deepEqual(cspViolations, [], "the policy blocked something the console uses");
    seen.csp_violations = cspViolations.length;
  } finally {
    await browser.close();
  }
  console.log(JSON.stringify(seen));
}

main().catch((error) => {
  console.error(error.stack || String(error));
  process.exit(1);
});
