// Known divergence: a peeked message's deliveryCount. Service Bus reports the number of
// deliveries so far (0 for a message never received, 1 after one abandon); the emulator leaves
// the header out of a never-delivered message (undefined) and reports one less after that.
"use strict";

const assert = require("node:assert/strict");

module.exports.divergence =
  "https://learn.microsoft.com/dotnet/api/azure.messaging.servicebus.servicebusreceivedmessage.deliverycount";

module.exports.run = async (t) => {
  await t.sender("peekcount").sendMessages({ body: "x", messageId: t.id("x") });
  const receiver = t.receiver("peekcount");

  const [fresh] = await receiver.peekMessages(1);
  t.stillDiverges(
    fresh.deliveryCount === undefined,
    "peek of a never-delivered message: deliveryCount undefined, not 0",
  );

  const [received] = await t.receiveAll(receiver, 1);
  assert.equal(received.deliveryCount, 0, "receive: header delivery-count of a first delivery");
  await receiver.abandonMessage(received);

  const [abandoned] = await receiver.peekMessages(1, {
    fromSequenceNumber: received.sequenceNumber,
  });
  t.stillDiverges(abandoned.deliveryCount === 0, "peek after one abandon: deliveryCount 0, not 1");

  const [again] = await t.receiveAll(receiver, 1);
  assert.equal(again.deliveryCount, 1, "receive after one abandon");
  await receiver.completeMessage(again);
};
