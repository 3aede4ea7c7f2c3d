// Known divergence: cancelling a sequence number that names no scheduled message. Service Bus
// answers "Messages not found" (MessageNotFound); the emulator succeeds silently, for an
// unknown number and for one already cancelled. Cancelling a real scheduled message works.
"use strict";

const assert = require("node:assert/strict");

module.exports.divergence = "https://github.com/Azure/azure-service-bus/issues/239";

module.exports.run = async (t) => {
  const sender = t.sender("cancelunknown");
  const [seq] = await sender.scheduleMessages(
    { body: "x", messageId: t.id("x") },
    new Date(Date.now() + 10 * 60_000),
  );
  await sender.cancelScheduledMessages(seq);
  const receiver = t.receiver("cancelunknown");
  assert.deepEqual(await receiver.peekMessages(5), [], "the cancelled message is gone");

  t.stillDiverges(
    (await t.errorOf(sender.cancelScheduledMessages(seq))) === undefined,
    "cancelling an already-cancelled sequence number succeeds",
  );
  t.stillDiverges(
    (await t.errorOf(sender.cancelScheduledMessages(seq.add(424242)))) === undefined,
    "cancelling an unknown sequence number succeeds",
  );
};
