// Known divergence: scheduling a message whose id is inside the duplicate-detection window.
// Both drop the copy (the ids are shared); Service Bus still returns a sequence number, the
// emulator returns -1.
"use strict";

const assert = require("node:assert/strict");

module.exports.divergence = "https://github.com/Azure/azure-service-bus/issues/265";

module.exports.run = async (t) => {
  const sender = t.sender("scheddup");
  await sender.sendMessages({ body: "original", messageId: t.id("dup") });
  const [seq] = await sender.scheduleMessages(
    { body: "copy", messageId: t.id("dup") },
    new Date(Date.now() + 500),
  );
  t.stillDiverges(seq.toNumber() === -1, "the schedule request returns sequence number -1");

  await t.sleep(800);
  const receiver = t.receiver("scheddup", { receiveMode: "receiveAndDelete" });
  const received = await t.receiveAll(receiver, 2, 1000);
  assert.deepEqual(
    received.map((m) => m.body),
    ["original"],
    "the scheduled copy was dropped",
  );
};
