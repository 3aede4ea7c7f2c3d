// Sending to or receiving from an entity that does not exist fails with
// MessagingEntityNotFound (the emulator creates nothing on the fly).
"use strict";

module.exports.run = async (t) => {
  await t.expectServiceBusError(
    t.sender("no-such-queue").sendMessages({ body: "x", messageId: t.id("x") }),
    "MessagingEntityNotFound",
  );
  await t.expectServiceBusError(
    t.receiver("no-such-queue").receiveMessages(1, { maxWaitTimeInMs: 1000 }),
    "MessagingEntityNotFound",
  );
};
