// Known divergence: properties to modify when settling. Service Bus applies the properties
// passed to abandonMessage, deferMessage and deadLetterMessage to the message's application
// properties (the modified outcome's message-annotations); the emulator ignores them. The
// dead-letter reason and description are applied.
"use strict";

const assert = require("node:assert/strict");

module.exports.divergence =
  "https://learn.microsoft.com/dotnet/api/azure.messaging.servicebus.servicebusreceiver.abandonmessageasync";

module.exports.run = async (t) => {
  await t.sender("modify").sendMessages({
    body: "x",
    messageId: t.id("x"),
    applicationProperties: { kept: "yes" },
  });
  const receiver = t.receiver("modify");
  const [first] = await t.receiveAll(receiver, 1);
  await receiver.abandonMessage(first, { attempt: 1 });

  const [second] = await t.receiveAll(receiver, 1);
  assert.equal(second.applicationProperties.kept, "yes");
  t.stillDiverges(
    second.applicationProperties.attempt === undefined,
    "abandonMessage's properties are not applied",
  );
  await receiver.deferMessage(second, { deferredBy: "scenario" });
  const [deferred] = await receiver.receiveDeferredMessages(second.sequenceNumber);
  t.stillDiverges(
    deferred.applicationProperties.deferredBy === undefined,
    "deferMessage's properties are not applied",
  );
  await receiver.deadLetterMessage(deferred, {
    deadLetterReason: "Reason",
    deadLetterErrorDescription: "Description",
    extra: 5,
  });

  const deadLetters = t.receiver("modify", { subQueueType: "deadLetter" });
  const [dead] = await t.receiveAll(deadLetters, 1);
  assert.equal(dead.deadLetterReason, "Reason");
  assert.equal(dead.deadLetterErrorDescription, "Description");
  t.stillDiverges(
    dead.applicationProperties.extra === undefined,
    "deadLetterMessage's extra properties are not applied",
  );
  await deadLetters.completeMessage(dead);
};
