// Scheduling a message whose id is inside the duplicate-detection window: the copy is dropped
// (scheduled and sent messages share the ids) and a sequence number is still returned, a new
// one (https://github.com/Azure/azure-service-bus/issues/265). It names no message: cancelling
// it fails with MessageNotFound.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const sender = t.sender("scheddup");
  await sender.sendMessages({ body: "original", messageId: t.id("dup") });
  const [seq] = await sender.scheduleMessages(
    { body: "copy", messageId: t.id("dup") },
    new Date(Date.now() + 500),
  );
  assert.ok(seq.toNumber() > 0, `a sequence number is returned, got ${seq}`);
  await t.expectServiceBusError(sender.cancelScheduledMessages(seq), "MessageNotFound");

  await t.sleep(800);
  const receiver = t.receiver("scheddup", { receiveMode: "receiveAndDelete" });
  const received = await t.receiveAll(receiver, 2, 1000);
  assert.deepEqual(
    received.map((m) => m.body),
    ["original"],
    "the scheduled copy was dropped",
  );
};
