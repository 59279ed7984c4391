// Drives the dashboard's queue page in headless Chromium (the system browser, through
// playwright-core) for a queue with admission fair sharing:
//   node fair_sharing.test.mjs --url http://127.0.0.1:PORT --token TOKEN --queue NAME
//                              --last WORKSPACE [--first WORKSPACE] [--screenshots DIR]
// The queue's fair-sharing table must list its workspaces lowest usage first (`first`, when given,
// at the top) and `last` at the bottom with a usage above zero, each row agreeing with the API's
// queue view.
// Exits non-zero on the first failed check; prints one line per check.
import { chromium } from "playwright-core";
import fs from "node:fs";
import path from "node:path";

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith("--")) acc.push([a.slice(2), all[i + 1]]);
  return acc;
}, []));
const { url, token, queue, first, last } = args;
const shots = args.screenshots || "";
if (!url || !token || !queue || !last) {
  console.error("usage: fair_sharing.test.mjs --url URL --token TOKEN --queue NAME --last WS [--first WS]");
  process.exit(2);
}
const ok = (msg) => console.log(`ok   ${msg}`);

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
                                        headless: true, args: ["--no-sandbox"] });
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  await page.goto(`${url}/#/queues`);
  await page.waitForSelector("#signin", { timeout: 15000 });
  await page.fill("#signin input[name=token]", token);
  await page.click("#signin button");
  await page.waitForSelector("#who:not(:empty)", { timeout: 15000 });
  await page.goto(`${url}/#/queues`);
  const table = `section.queue[data-queue="${queue}"] table.fair-usage`;
  await page.waitForSelector(`${table} tr[data-workspace]`, { timeout: 15000 });
  const rows = await page.$$eval(`${table} tr[data-workspace]`, (trs) => trs.map((tr) => ({
    workspace: tr.dataset.workspace,
    cells: [...tr.querySelectorAll("td")].map((td) => td.textContent.trim()),
  })));
  if ((first && rows[0].workspace !== first) || rows[rows.length - 1].workspace !== last)
    throw new Error(`order: ${JSON.stringify(rows.map((r) => r.workspace))}, want ${last} last`);
  const usages = rows.map((r) => Number(r.cells[1]));
  if (usages.some((u, i) => i > 0 && u < usages[i - 1])) throw new Error(`usage not ascending: ${usages}`);
  if (!(usages[usages.length - 1] > 0)) throw new Error(`${last} shows no usage: ${JSON.stringify(rows)}`);
  // The page says what the API says.
  const api = await page.evaluate(async (q) => (await (await fetch(`/api/v1/queues?limit=1`)).json())
    .queues.find((x) => x.name === q).fair_usage, queue);
  for (const row of rows) {
    const want = api.find((f) => f.workspace === row.workspace);
    if (!want) throw new Error(`${row.workspace} is not in the API's fair_usage`);
    if (want.usage !== null && Math.abs(Number(row.cells[1]) - want.usage) > 0.01)
      throw new Error(`${row.workspace}: page ${row.cells[1]}, API ${want.usage}`);
    if (String(want.weight) !== row.cells[2]) throw new Error(`${row.workspace}: weight ${row.cells[2]}, API ${want.weight}`);
  }
  ok(`fair sharing table: ${rows.map((r) => `${r.workspace} ${r.cells[1]} (weight ${r.cells[2]})`).join(", ")}`);
  if (errors.length) throw new Error(`page errors: ${errors.join("; ")}`);
  if (shots) {
    fs.mkdirSync(shots, { recursive: true });
    await page.screenshot({ path: path.join(shots, "dashboard-fair-sharing.png") });
    ok("screenshot dashboard-fair-sharing.png");
  }
} finally {
  await browser.close();
}
