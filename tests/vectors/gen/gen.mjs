// Node half of the vector generator: a line-oriented RPC server that gen.py
// starts (it copies this file into the npm folder holding package.json's
// pinned packages, so that imports resolve there). One JSON request per line
// on stdin, one JSON answer per line on stdout. Only official libraries here.
import { createInterface } from "node:readline";
import { createRequire } from "node:module";
import { sign as octoSign, verify as octoVerify } from "@octokit/webhooks-methods";
import { signWebhookPayload, verifyWebhookSignature } from "@notionhq/client";
import Mux from "@mux/mux-node";

const require = createRequire(import.meta.url);
const { AwsLambdaReceiver } = require("@zoom/rivet/meetings");
const { WebflowClient } = require("webflow-api");

console.debug = () => {}; // rivet logs every Lambda event through console.debug
const realNow = Date.now;

const ops = {
  async "octokit.sign"({ secret, payload }) { return await octoSign(secret, payload); },
  async "octokit.verify"({ secret, payload, signature }) {
    try { return await octoVerify(secret, payload, signature); } catch (e) { return false; }
  },
  async "notion.sign"({ token, body }) { return await signWebhookPayload({ body, verificationToken: token }); },
  async "notion.verify"({ token, body, signature }) {
    return await verifyWebhookSignature({ body, signature, verificationToken: token });
  },
  async "mux.verify"({ body, headers, secret, now }) {
    const mux = new Mux({ tokenId: "x", tokenSecret: "y" });
    Date.now = () => now * 1000;
    try { await mux.webhooks.verifySignature(body, headers, secret); return true; }
    catch (e) { return false; }
    finally { Date.now = realNow; }
  },
  async "rivet.verify"({ body, headers, secret }) {
    const r = new AwsLambdaReceiver({ webhooksSecretToken: secret });
    r.init({ eventEmitter: { emit: async () => {} } });
    const res = await r.start()({ body, headers, isBase64Encoded: false }, {});
    return { ok: res.statusCode === 200, status: res.statusCode, body: res.body };
  },
  async "webflow.verify"({ body, headers, secret }) {
    const c = new WebflowClient({ accessToken: "x" });
    try { return await c.webhooks.verifySignature({ headers, body, secret }); } catch (e) { return false; }
  },
};

const rl = createInterface({ input: process.stdin });
for await (const line of rl) {
  if (!line.trim()) continue;
  const req = JSON.parse(line);
  let out;
  try { out = { ok: true, result: await ops[req.op](req.args) }; }
  catch (e) { out = { ok: false, error: String(e && e.stack || e) }; }
  process.stdout.write(JSON.stringify(out) + "\n");
}
