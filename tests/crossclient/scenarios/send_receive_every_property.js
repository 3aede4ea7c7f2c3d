// Every ServiceBusMessage property the JavaScript client can set survives the emulator.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const sentAt = new Date();
  const message = {
    body: Buffer.from("paid"),
    messageId: t.id("12345.2017/payment"),
    contentType: "application/octet-stream",
    correlationId: "corr-1",
    subject: "payment",
    to: "billing",
    replyTo: "replies",
    replyToSessionId: "reply-session",
    timeToLive: 120_000,
    applicationProperties: {
      text: "é-ü",
      integer: 42,
      negative: -7,
      fraction: 2.5,
      flag: true,
      nothing: null,
      when: new Date("2017-03-04T05:06:07.000Z"),
    },
  };
  await t.sender("props").sendMessages(message);

  const receiver = t.receiver("props");
  const [received] = await t.receiveAll(receiver, 1);
  assert.ok(received, "the message was not received");
  assert.deepEqual(received.body, message.body);
  for (const field of [
    "messageId",
    "contentType",
    "correlationId",
    "subject",
    "to",
    "replyTo",
    "replyToSessionId",
    "timeToLive",
  ]) {
    assert.deepEqual(received[field], message[field], field);
  }
  // Dates in application properties arrive as epoch milliseconds (the client's default).
  assert.deepEqual(received.applicationProperties, {
    ...message.applicationProperties,
    when: message.applicationProperties.when.getTime(),
  });

  // Broker-owned properties.
  assert.equal(typeof received.lockToken, "string");
  assert.ok(received.sequenceNumber.toNumber() >= 1, "sequenceNumber");
  assert.ok(received.enqueuedTimeUtc >= new Date(sentAt.getTime() - 2000), "enqueuedTimeUtc");
  assert.equal(
    received.expiresAtUtc.getTime(),
    received.enqueuedTimeUtc.getTime() + message.timeToLive,
    "expiresAtUtc is enqueuedTimeUtc + timeToLive",
  );
  assert.ok(received.lockedUntilUtc > received.enqueuedTimeUtc, "lockedUntilUtc");
  assert.equal(received.deliveryCount, 0, "deliveryCount on the first delivery (raw AMQP header)");
  assert.equal(received.state, "active");

  await receiver.completeMessage(received);
  await t.expectEmpty(receiver);
};
