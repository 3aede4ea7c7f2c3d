// Known divergence: entity names. Service Bus resolves queue and topic names case-insensitively;
// the emulator's are case-sensitive, so "CASING" is not the queue "casing".
"use strict";

const assert = require("node:assert/strict");

module.exports.divergence =
  "https://learn.microsoft.com/azure/azure-resource-manager/management/resource-name-rules#microsoftservicebus";

module.exports.run = async (t) => {
  await t.sender("casing").sendMessages({ body: "x", messageId: t.id("lower") });
  const error = await t.errorOf(
    t.sender("CASING").sendMessages({ body: "x", messageId: t.id("upper") }),
  );
  t.stillDiverges(
    error !== undefined && error.code === "MessagingEntityNotFound",
    "the queue's name in capitals is MessagingEntityNotFound",
  );
  const receiver = t.receiver("casing", { receiveMode: "receiveAndDelete" });
  const received = await t.receiveAll(receiver, 2, 1000);
  assert.deepEqual(
    received.map((m) => m.messageId),
    [t.id("lower")],
  );
};
