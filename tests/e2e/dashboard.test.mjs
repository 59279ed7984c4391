// Drives tau's dashboard in headless Chromium (the system browser, through playwright-core).
//   node dashboard.test.mjs --url http://127.0.0.1:PORT --token TOKEN --train RUN --pending RUN
//                           [--resumed RUN] [--compare RUN] [--service NAME] [--screenshots DIR]
// `train` is a run that writes loss points and succeeds; `pending` is a run that waits for quota;
// `resumed` one that was cancelled and resumed, and runs again; `compare` a second training run
// with train and validation losses of its own, compared with `train`; `service` a service
// deployed from `train` (it may still be coming up) that is sent requests while the test runs.
// Exits non-zero on the first failed check; prints one line per check.
import { chromium } from "playwright-core";
import fs from "node:fs";
import path from "node:path";

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith("--")) acc.push([a.slice(2), all[i + 1]]);
  return acc;
}, []));
const url = args.url, train = args.train, pending = args.pending, token = args.token;
const resumed = args.resumed || "";
const other = args.compare || "";
const service = args.service || "";
const shots = args.screenshots || "";
const browserPath = process.env.CHROMIUM || "/usr/bin/chromium";
if (!url || !train || !pending || !token) {
  console.error("usage: dashboard.test.mjs --url URL --token TOKEN --train RUN --pending RUN [--screenshots DIR]");
  process.exit(2);
}
if (shots) fs.mkdirSync(shots, { recursive: true });

const ok = (msg) => console.log(`ok   ${msg}`);
async function shot(page, name) {
  if (!shots) return;
  await page.screenshot({ path: path.join(shots, name), fullPage: false });
  ok(`screenshot ${name}`);
}

// The pixels of a chart's canvas that are not transparent, and a digest of the picture.
async function canvasState(page, metric) {
  return page.$eval(`#cmp-charts .chart[data-metric="${metric}"] canvas`, (c) => {
    const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let painted = 0;
    for (let i = 3; i < d.length; i += 4) if (d[i] !== 0) painted++;
    return { painted, picture: c.toDataURL() };
  });
}

// Two runs ticked in the list, compared: one loss chart with both runs' train and validation
// curves; the log scale and the smoothing redraw it; the config table names what differs.
async function checkCompare(page) {
  await page.waitForFunction(async (n) => (await (await fetch(`/api/v1/runs/${n}`)).json()).run.state === "Succeeded", other, { timeout: 90000, polling: 500 });
  await page.goto(`${url}/#/runs`);
  if (!(await page.isDisabled("#compare-selected"))) throw new Error("compare is offered with no run ticked");
  await page.check(`#runs tr[data-run="${train}"] input.pick`);
  await page.check(`#runs tr[data-run="${other}"] input.pick`);
  await page.waitForSelector("#compare-selected:not([disabled])", { timeout: 5000 });
  await page.click("#compare-selected");
  const loss = '#cmp-charts .chart[data-metric="loss"]';
  await page.waitForSelector(`${loss} canvas`, { timeout: 20000 });
  const series = await page.getAttribute(loss, "data-series");
  const legend = await page.$$eval(`${loss} .u-legend .u-series`, (rows) => rows.map((r) => r.textContent.trim()));
  // uPlot's legend has the x series first, then one row per curve.
  if (series !== "4" || legend.length !== 5) throw new Error(`loss chart: ${series} series, legend ${JSON.stringify(legend)}`);
  for (const want of [`${train} · train`, `${train} · val`, `${other} · train`, `${other} · val`])
    if (!legend.some((l) => l.startsWith(want))) throw new Error(`legend lacks ${want}: ${JSON.stringify(legend)}`);
  const linear = await canvasState(page, "loss");
  if (linear.painted < 500) throw new Error(`the loss chart's canvas is empty (${linear.painted} pixels painted)`);
  ok(`compare view: loss chart with 4 curves (2 runs, train and val), ${linear.painted} pixels painted`);
  // Attempt boundaries, one per run and later attempt: a run whose attempt 2 begins at step 6 in
  // train and step 9 in val has one, at step 6 (one "attempt 2" label, not one per split).
  const bounds = await page.evaluate(() => {
    const pts = (steps, attempt) => steps.map((step) => ({ step, value: 1, attempt }));
    return attemptBounds([
      { run: "a", points: [...pts([0, 5], 1), ...pts([6, 7], 2)] },
      { run: "a", points: [...pts([4], 1), ...pts([9], 2)] },
      { run: "b", points: [...pts([0, 1], 1)] },
    ], ["a", "b"]);
  });
  if (JSON.stringify(bounds) !== JSON.stringify([{ attempt: 2, step: 6, run: "a" }]))
    throw new Error(`attempt boundaries: ${JSON.stringify(bounds)}`);
  ok("attempt boundaries: one per run and attempt");

  await page.check("#cmp-log");
  await page.waitForSelector(`${loss}[data-scale="log"] canvas`, { timeout: 5000 });
  const log = await canvasState(page, "loss");
  if (log.picture === linear.picture || log.painted < 500) throw new Error("the log scale changed nothing on the chart");
  await page.uncheck("#cmp-log");
  await page.waitForSelector(`${loss}[data-scale="linear"] canvas`, { timeout: 5000 });
  ok("log scale toggles the chart");

  await page.$eval("#cmp-smooth", (el) => { el.value = "0.8"; el.dispatchEvent(new Event("input", { bubbles: true })); });
  await page.waitForFunction((before) => {
    const c = document.querySelector('#cmp-charts .chart[data-metric="loss"] canvas');
    return c && c.toDataURL() !== before;
  }, linear.picture, { timeout: 5000 });
  if ((await page.textContent("#cmp-smooth-value")).trim() !== "0.8") throw new Error("the smoothing value is not shown");
  ok("smoothing redraws the chart");

  await page.waitForSelector('#cmp-config-table tr[data-field="name"]', { timeout: 15000 });
  const fields = await page.$$eval("#cmp-config-table tr[data-field]", (rows) => rows.map((r) => r.dataset.field));
  // The canonical spec keeps the entrypoint's arguments as `args`: the second run's "0.3".
  if (!fields.includes("args[0]")) throw new Error(`config differences lack args[0]: ${fields}`);
  const cell = await page.textContent(`#cmp-config-table tr[data-field="args[0]"] td:nth-child(3)`);
  if (cell.trim() !== "0.3") throw new Error(`args[0] of ${other}: ${cell}`);
  ok(`config differences: ${fields.join(", ")}`);
  await page.evaluate(() => window.scrollTo(0, 0));
  await shot(page, "dashboard-compare.png");
}

// The service in the services list with every wanted replica ready, then its page: replicas,
// model, history newest first, and the request rate (and, where /metrics may be read, the mean
// latency) charted from the page's own polls.
async function checkServices(page) {
  await page.goto(`${url}/#/services`);
  const row = `#services tr[data-service="${service}"]`;
  await page.waitForSelector(row, { timeout: 90000 });
  await page.waitForFunction((sel) => {
    const m = /^(\d+)\/(\d+)$/.exec((document.querySelector(sel) || {}).textContent?.trim() || "");
    return m && m[1] === m[2] && Number(m[2]) > 0;
  }, `${row} td.svc-ready`, { timeout: 90000, polling: 250 });
  const ready = (await page.textContent(`${row} td.svc-ready`)).trim();
  const wanted = Number(ready.split("/")[1]);
  const cells = await page.$$eval(`${row} td`, (tds) => tds.map((td) => td.textContent.trim()));
  if (cells[2] !== "Active" || cells[7] !== `/serve/${service}/`) throw new Error(`services row: ${JSON.stringify(cells)}`);
  ok(`services list: ${service} ${ready} ready, ${cells[6]} requests`);
  if ((await page.getAttribute('nav a[data-nav="services"]', "class")) !== "active") throw new Error("the Services tab is not marked active");

  await page.click(`${row} a`);
  await page.waitForSelector("#replicas tbody tr", { timeout: 15000 });
  await page.waitForFunction((n) => document.querySelectorAll('#replicas tbody tr [data-state="Ready"]').length === n, wanted, { timeout: 15000 });
  const replicas = await page.$$eval("#replicas tbody tr", (rows) => rows.map((r) => ({ run: r.dataset.run, href: r.querySelector("a").getAttribute("href") })));
  if (replicas.length !== wanted || replicas.some((r) => r.href !== `#/runs/${r.run}`)) throw new Error(`replica rows: ${JSON.stringify(replicas)}`);
  ok(`service page: ${replicas.length} replica rows, all ready (${replicas.map((r) => r.run).join(", ")})`);

  const model = await page.$eval('#svc-spec-table a[href^="#/runs/"]', (a) => a.textContent);
  if (model !== train) throw new Error(`the model's run is ${model}, not ${train}`);
  const sha = (await page.textContent("#svc-spec-table td.svc-sha")).trim();
  if (!/^[0-9a-f]{16}…$/.test(sha)) throw new Error(`the model's sha256: ${sha}`);
  ok(`model: run ${model}, sha256 ${sha}`);

  const history = await page.$$eval("#svc-history li[data-time]", (lis) => lis.map((li) => [li.dataset.time, li.querySelector("b").textContent]));
  if (history.length < 2) throw new Error(`history: ${JSON.stringify(history)}`);
  for (let i = 1; i < history.length; i++)
    if (Date.parse(history[i - 1][0]) < Date.parse(history[i][0])) throw new Error(`history is not newest first: ${JSON.stringify(history)}`);
  if (history[history.length - 1][1] !== "Deployed") throw new Error(`the oldest history entry is ${history[history.length - 1][1]}`);
  ok(`history newest first: ${history.map((h) => h[1]).join(", ")}`);

  // The chart's points are the page's polls (every 2 s): wait for a few, with traffic in them.
  const rate = '#svc-charts .chart[data-metric="requests"]';
  await page.waitForFunction((sel) => Number(document.querySelector(sel).dataset.points) >= 5, rate, { timeout: 40000, polling: 500 });
  const last = await page.textContent(`${rate} h3 .muted`);
  const painted = await page.$eval(`${rate} canvas`, (c) => {
    const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 3; i < d.length; i += 4) if (d[i] !== 0) n++;
    return n;
  });
  if (!/last [1-9]|last 0\.\d*[1-9]/.test(last) || painted < 200) throw new Error(`request rate chart: ${last}, ${painted} pixels painted`);
  ok(`request rate chart: ${last.trim()}, ${painted} pixels painted`);
  const metrics = await page.evaluate(async () => (await fetch("/metrics")).status);
  if (metrics === 200) {
    const lat = '#svc-charts .chart[data-metric="latency"]';
    await page.waitForFunction((sel) => Number(document.querySelector(sel).dataset.points) >= 2, lat, { timeout: 20000, polling: 500 });
    ok(`mean latency chart: ${(await page.textContent(`${lat} h3 .muted`)).trim()}`);
  } else {
    if (await page.$('#svc-charts .chart[data-metric="latency"]')) throw new Error(`a latency chart without /metrics (${metrics})`);
    console.log(`skip latency chart: GET /metrics answered ${metrics}`);
  }
  await page.setViewportSize({ width: 1280, height: 1100 });
  await page.evaluate(() => window.scrollTo(0, 0));
  await shot(page, "dashboard-services.png");
  await page.setViewportSize({ width: 1280, height: 800 });

  // A user who may not read /metrics (a 403 here) gets the request rate only, and is told why.
  await page.route("**/metrics", (r) => r.fulfill({ status: 403, contentType: "application/json", body: '{"error":{"message":"forbidden"}}' }));
  await page.goto(`${url}/#/services`);
  await page.waitForSelector(row, { timeout: 15000 });
  await page.goto(`${url}/#/services/${service}`);
  await page.waitForFunction((sel) => Number(document.querySelector(sel)?.dataset.points) >= 2, rate, { timeout: 20000, polling: 500 });
  if (await page.$('#svc-charts .chart[data-metric="latency"]')) throw new Error("a latency chart although /metrics was refused");
  if (!/may not read/.test(await page.textContent("#svc-chart-note"))) throw new Error("the page does not say why there is no latency chart");
  await page.unroute("**/metrics");
  ok("without /metrics: the request rate only, and the page says why");

  // A replica's run page links back to its service.
  await page.click(`#replicas tr[data-run="${replicas[0].run}"] a`);
  await page.waitForSelector(`#run-service[href="#/services/${service}"]`, { timeout: 15000 });
  await page.waitForSelector('#run-state [data-state="Running"]', { timeout: 15000 });
  ok("a replica's run page links to its service");
}

const browser = await chromium.launch({ executablePath: browserPath, headless: true, args: ["--no-sandbox"] });
let failed = false;
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));

  // Signed out, the page asks for a token; a wrong one is refused with the server's message, the
  // right one signs in (an HttpOnly cookie the page cannot read).
  await page.goto(`${url}/#/runs`);
  await page.waitForSelector("#signin", { timeout: 15000 });
  await page.fill("#signin input[name=token]", "tau_wrong");
  await page.click("#signin button");
  await page.waitForFunction(() => /unknown API token/.test(document.getElementById("signin-error").textContent), null, { timeout: 10000 });
  ok("a wrong token is refused");
  await page.fill("#signin input[name=token]", token);
  await page.click("#signin button");
  await page.waitForSelector("#who:not(:empty)", { timeout: 15000 });
  if (await page.evaluate(() => document.cookie.includes("tau_session"))) throw new Error("the session cookie is readable by scripts");
  ok("signed in with a token");

  // The runs list shows both runs, and the live badge says the event stream is connected.
  await page.goto(`${url}/#/runs`);
  await page.waitForSelector(`#runs tr[data-run="${train}"]`, { timeout: 15000 });
  await page.waitForSelector(`#runs tr[data-run="${pending}"]`, { timeout: 15000 });
  await page.waitForSelector("#live.on", { timeout: 10000 });
  ok("runs list shows the submitted runs; live stream connected");

  // The run page: opened while the run is still going, it must reach Succeeded without a reload
  // (the event stream drives the refresh).
  await page.goto(`${url}/#/runs/${train}`);
  await page.waitForSelector('#run-state [data-state]', { timeout: 15000 });
  const first = await page.textContent("#run-state");
  ok(`run page open, state ${first.trim()}`);
  await page.waitForSelector('#run-state [data-state="Succeeded"]', { timeout: 60000 });
  ok("run reached Succeeded on the page");
  await page.waitForSelector("#attempts tbody tr", { timeout: 10000 });
  await page.waitForSelector("#timeline li", { timeout: 10000 });
  await page.waitForFunction(() => document.getElementById("log").textContent.includes("step"), null, { timeout: 15000 });
  ok("timeline, attempts and log tail shown");

  // The artifacts the run wrote (its output file), listed with a download link that serves the
  // file's bytes.
  const artifact = await page.waitForSelector('#artifacts-table tr[data-path="output/summary.txt"] a.artifact-download', { timeout: 15000 });
  const href = await artifact.getAttribute("href");
  const fetched = await page.evaluate(async (h) => { const r = await fetch(h); return [r.status, await r.text()]; }, href);
  if (fetched[0] !== 200 || fetched[1] !== "final loss 0.05\n") throw new Error(`artifact download: ${fetched}`);
  ok("artifacts listed; the output file downloads");

  // The loss chart, from GET /api/v1/runs/NAME/metrics when the server has it.
  const metrics = await page.evaluate(async (n) => (await fetch(`/api/v1/runs/${n}/metrics`)).status, train);
  if (metrics === 200) {
    const chart = await page.waitForSelector('#metrics .chart[data-metric^="loss"] canvas', { timeout: 20000 });
    await chart.scrollIntoViewIfNeeded();
    ok("loss chart drawn");
  } else {
    await page.waitForSelector("#no-metrics", { timeout: 10000 });
    console.log(`skip loss chart: GET /api/v1/runs/NAME/metrics answered ${metrics}`);
  }
  await page.evaluate(() => window.scrollTo(0, 0));
  await shot(page, "dashboard-run.png");
  if (metrics === 200) {
    await page.locator("#metrics").scrollIntoViewIfNeeded();
    await shot(page, "dashboard-loss.png");
  }

  // The pending run explains itself on the queue page and on its own page.
  await page.goto(`${url}/#/queues`);
  const row = await page.waitForSelector(`table.pending tr[data-run="${pending}"] td.reason`, { timeout: 15000 });
  const reason = (await row.textContent()).trim();
  if (!reason) throw new Error("the pending run shows no reason");
  ok(`queue page: ${pending} pending: ${reason}`);
  // Quotas in people's units, as tau top shows them: never "24683772Ki".
  const usage = await page.locator("section.queue .bar em").allTextContents();
  if (usage.some((t) => /\d{4,}Ki/.test(t))) throw new Error(`queue usage in raw Ki: ${usage.join("; ")}`);
  ok(`queue usage: ${usage.join("; ")}`);
  await shot(page, "dashboard-queues.png");
  await page.goto(`${url}/#/runs/${pending}`);
  await page.waitForSelector("#pending-reason", { timeout: 15000 });
  ok("run page shows the pending reason");

  // Filters: state=Succeeded lists the finished run and not the pending one.
  await page.goto(`${url}/#/runs?state=Succeeded`);
  await page.waitForSelector(`#runs tr[data-run="${train}"]`, { timeout: 15000 });
  if (await page.$(`#runs tr[data-run="${pending}"]`)) throw new Error("state filter ignored");
  ok("state filter");
  await page.goto(`${url}/#/runs`);
  await page.waitForSelector(`#runs tr[data-run="${pending}"]`, { timeout: 15000 });
  await shot(page, "dashboard-runs.png");

  if (other) await checkCompare(page);
  if (service) await checkServices(page);

  // A resumed run is Running again, and shows no trace of its cancel as its reason.
  if (resumed) {
    await page.goto(`${url}/#/runs/${resumed}`);
    await page.waitForSelector('#run-state [data-state="Running"]', { timeout: 15000 });
    const why = await page.$("#run-reason");
    const text = why ? (await why.textContent()).trim() : "";
    if (/cancel/i.test(text)) throw new Error(`a resumed run still shows its cancel: ${text}`);
    ok("resumed run: Running, no stale reason");
  }

  // The GPU page: each GPU with its health and its latest sample from the monitor.
  await page.goto(`${url}/#/gpus`);
  await page.waitForSelector("#gpu-table td.gpu-sample", { timeout: 15000 });
  await page.waitForFunction(() => /at \S/.test(document.querySelector("#gpu-table td.gpu-sample").textContent), null, { timeout: 15000 });
  const sample = (await page.textContent("#gpu-table td.gpu-sample")).trim();
  const api = await page.evaluate(async () => (await (await fetch("/api/v1/gpus")).json()).snapshot.gpus[0].sample);
  if (api.temperature_c != null && !/\d °C/.test(sample)) throw new Error(`the latest sample lacks the temperature: ${sample}`);
  ok(`GPU page: latest sample ${sample}`);
  await shot(page, "dashboard-gpus.png");

  // The usage page: what each workspace held, a chart of it a day, and the budgets.
  await page.goto(`${url}/#/usage?by=workspace&since=7d`);
  await page.waitForSelector("#usage-table tr[data-key]", { timeout: 15000 });
  const keys = await page.$$eval("#usage-table tr[data-key]", (rows) => rows.map((r) => r.dataset.key));
  await page.waitForSelector("#usage-chart .chart canvas", { timeout: 15000 });
  const drawn = await page.getAttribute("#usage-chart .chart", "data-series");
  ok(`usage page: ${keys.join(", ")}; a chart of ${drawn} series`);
  await page.selectOption('#usage-filters select[name="by"]', "run");
  await page.waitForSelector(`#usage-table tr[data-key="${train}"]`, { timeout: 15000 });
  ok("usage page by run lists the training run");
  await shot(page, "dashboard-usage.png");

  if (errors.length) throw new Error("page errors: " + errors.join("; "));
  ok("no page errors");
} catch (e) {
  failed = true;
  console.error(`FAIL ${e.message}`);
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
