// Loads the dashboard of a running `starling demo --keep-running` in headless Chromium
// (Debian's package, driven by playwright-core) and checks that the peers, their cards and
// a live group chat appear. Saves a screenshot.
//
// Usage: node dashboard.mjs http://127.0.0.1:7431 ../../target/dashboard.png
import { chromium } from "playwright-core";

const url = process.argv[2] ?? "http://127.0.0.1:7431";
const shot = process.argv[3] ?? "dashboard.png";
const chrome = process.env.CHROMIUM ?? "/usr/bin/chromium";

const browser = await chromium.launch({
  executablePath: chrome,
  headless: true,
  args: ["--no-sandbox", "--disable-gpu"],
});
let failed = false;
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(url + "/", { waitUntil: "domcontentloaded" });

  // Peers: the other two demo nodes, alive.
  await page.waitForFunction(
    () => document.querySelectorAll("#peers li[data-peer]").length >= 2,
    null,
    { timeout: 60_000 },
  );
  const peers = await page.$$eval("#peers li[data-peer]", (els) => els.map((e) => e.dataset.peer));
  console.log("peers:", peers.join(", "));

  // Cards of all three nodes.
  await page.waitForFunction(() => document.querySelectorAll("#cards li[data-card]").length >= 3, null, { timeout: 60_000 });

  // A live group chat: a group with messages arriving over the event stream.
  await page.waitForFunction(
    () => document.querySelectorAll("#groups [data-group] .msg").length >= 2,
    null,
    { timeout: 15 * 60_000 },
  );
  const msgs = await page.$$eval("#groups [data-group] .msg", (els) => els.length);
  console.log("messages shown:", msgs);
  const status = await page.textContent("#status");
  if (status !== "live") throw new Error("event stream not live: " + status);
  if (errors.length) throw new Error("page errors: " + errors.join("; "));
  await page.screenshot({ path: shot, fullPage: true });
  console.log("screenshot:", shot);
} catch (e) {
  failed = true;
  console.error("dashboard test failed:", e.message);
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
