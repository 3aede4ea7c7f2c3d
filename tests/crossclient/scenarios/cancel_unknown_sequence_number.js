// Cancelling a sequence number that names no scheduled message (unknown, or already cancelled)
// fails with "Messages not found" (MessageNotFound), as Service Bus answers
// (https://github.com/Azure/azure-service-bus/issues/239). Cancelling a real one works.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const sender = t.sender("cancelunknown");
  const [seq] = await sender.scheduleMessages(
    { body: "x", messageId: t.id("x") },
    new Date(Date.now() + 10 * 60_000),
  );
  await sender.cancelScheduledMessages(seq);
  const receiver = t.receiver("cancelunknown");
  assert.deepEqual(await receiver.peekMessages(5), [], "the cancelled message is gone");

  await t.expectServiceBusError(sender.cancelScheduledMessages(seq), "MessageNotFound");
  await t.expectServiceBusError(
    sender.cancelScheduledMessages(seq.add(424242)),
    "MessageNotFound",
  );
};
