// Properties to modify when settling. Service Bus applies the properties passed to
// abandonMessage, deferMessage and deadLetterMessage to the message's application properties
// (sent as the modified outcome's message-annotations, in the rejected outcome's error info, or
// as the management request's properties-to-modify for a deferred message); the others stay.
// https://learn.microsoft.com/dotnet/api/azure.messaging.servicebus.servicebusreceiver.abandonmessageasync
"use strict";

const assert = require("node:assert/strict");

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
  assert.equal(second.applicationProperties.attempt, 1, "abandonMessage's properties");
  await receiver.deferMessage(second, { deferredBy: "scenario" });
  const [deferred] = await receiver.receiveDeferredMessages(second.sequenceNumber);
  assert.equal(deferred.applicationProperties.deferredBy, "scenario", "deferMessage's");
  assert.equal(deferred.applicationProperties.attempt, 1, "earlier changes stay");
  await receiver.deadLetterMessage(deferred, {
    deadLetterReason: "Reason",
    deadLetterErrorDescription: "Description",
    extra: 5,
  });

  const deadLetters = t.receiver("modify", { subQueueType: "deadLetter" });
  const [dead] = await t.receiveAll(deadLetters, 1);
  assert.equal(dead.deadLetterReason, "Reason");
  assert.equal(dead.deadLetterErrorDescription, "Description");
  assert.equal(dead.applicationProperties.extra, 5, "deadLetterMessage's other properties");
  assert.equal(dead.applicationProperties.kept, "yes");
  assert.equal(dead.applicationProperties.deferredBy, "scenario");
  await deadLetters.completeMessage(dead);
};
