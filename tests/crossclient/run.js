#!/usr/bin/env node
// Runs the cross-client scenarios with the JavaScript Service Bus SDK against one emulator.
//
//   SERVICEBUS_CONNECTION_STRING='Endpoint=sb://127.0.0.1:PORT;...;UseDevelopmentEmulator=true;' \
//   NODE_PATH="$(tests/crossclient/install.sh)" node tests/crossclient/run.js [name ...]
//
// Prints one JSON line per scenario ({"scenario", "status", "seconds", "error"?,
// "divergence"?}) so the caller can report each on its own; exits 1 when any failed.
// The broker must hold the entities of entities.json, each used by one scenario only,
// so scenarios run concurrently (most of their time is spent waiting on the broker).
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const { ServiceBusClient } = require("@azure/service-bus");
const { Scenario } = require("./lib/scenario");

const SCENARIO_TIMEOUT_MS = 45_000;
// The client's own operation timeout (60 s by default), kept well under the scenario's so an
// unanswered request fails as the client reports it (ServiceTimeout) at the call that waited.
const OPERATION_TIMEOUT_MS = 15_000;
const CLOSE_TIMEOUT_MS = 15_000;

function loadScenarios(only) {
  const dir = path.join(__dirname, "scenarios");
  const names = fs
    .readdirSync(dir)
    .filter((file) => file.endsWith(".js"))
    .map((file) => file.slice(0, -3))
    .sort();
  const unknown = only.filter((name) => !names.includes(name));
  if (unknown.length > 0) {
    throw new Error(`unknown scenario(s): ${unknown.join(", ")}`);
  }
  return names
    .filter((name) => only.length === 0 || only.includes(name))
    .map((name) => ({ name, module: require(path.join(dir, `${name}.js`)) }));
}

function withTimeout(promise, ms, name) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${name} did not finish within ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** The error and the stack frames outside node_modules: where in the scenario it failed. */
function describe(err) {
  if (!(err instanceof Error) || !err.stack) {
    return String(err);
  }
  const [headline, ...frames] = err.stack.split("\n");
  const ours = frames.filter(
    (frame) => !frame.includes("node_modules") && !frame.includes("node:"),
  );
  const code = err.code ? ` [code ${err.code}]` : "";
  return [`${headline}${code}`, ...ours].join("\n");
}

async function runOne(connectionString, { name, module }) {
  const started = Date.now();
  // One client, so one connection, per scenario: a scenario cannot disturb another's links.
  const client = new ServiceBusClient(connectionString, {
    retryOptions: { maxRetries: 0, timeoutInMs: OPERATION_TIMEOUT_MS },
  });
  const scenario = new Scenario(name, client, connectionString, OPERATION_TIMEOUT_MS);
  const result = { scenario: name };
  if (module.divergence) {
    result.divergence = module.divergence;
  }
  try {
    await withTimeout(module.run(scenario), SCENARIO_TIMEOUT_MS, name);
    result.status = "passed";
  } catch (err) {
    result.status = "failed";
    result.error = describe(err);
  }
  // Closing waits for the broker's detach and close: bounded too, and a close the broker never
  // answers fails the scenario rather than stalling the whole run.
  const closing = scenario.closeAll().then(() => client.close());
  const closeError = await withTimeout(closing, CLOSE_TIMEOUT_MS, `closing ${name}'s links`).then(
    () => undefined,
    (err) => err,
  );
  if (closeError !== undefined && result.status === "passed") {
    result.status = "failed";
    result.error = describe(closeError);
  }
  result.seconds = (Date.now() - started) / 1000;
  process.stdout.write(`${JSON.stringify(result)}\n`);
  return result;
}

async function main() {
  const connectionString = process.env.SERVICEBUS_CONNECTION_STRING;
  if (!connectionString) {
    throw new Error("set SERVICEBUS_CONNECTION_STRING to the emulator's connection string");
  }
  const concurrency = Number(process.env.CROSSCLIENT_CONCURRENCY || "6");
  const queue = loadScenarios(process.argv.slice(2));
  const results = [];
  const workers = Array.from({ length: Math.max(1, concurrency) }, async () => {
    while (queue.length > 0) {
      results.push(await runOne(connectionString, queue.shift()));
    }
  });
  await Promise.all(workers);
  return results.every((result) => result.status === "passed") ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (err) => {
    process.stderr.write(`${err && err.stack ? err.stack : err}\n`);
    process.exit(2);
  },
);
