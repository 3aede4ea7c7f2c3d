// An AmqpAnnotatedMessage keeps every section the client sends: header fields, every
// properties field the client maps, message annotations and the footer. Delivery annotations
// are per hop (AMQP 1.0, 3.2.2): the broker drops them.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const creationTime = Date.parse("2026-01-02T03:04:05.000Z");
  const sent = {
    body: Buffer.from("raw"),
    bodyType: "data",
    header: { priority: 7, durable: true, firstAcquirer: false, timeToLive: 600_000 },
    properties: {
      messageId: t.id("annotated"),
      to: "to",
      subject: "subject",
      replyTo: "reply-to",
      correlationId: "correlation",
      contentType: "application/x-raw",
      contentEncoding: "gzip",
      creationTime,
      groupId: "group",
      groupSequence: 3,
      replyToGroupId: "reply-group",
    },
    applicationProperties: { a: 1, s: "text" },
    messageAnnotations: { "x-custom": "kept", "x-number": 42 },
    deliveryAnnotations: { "x-hop": "dropped" },
    footer: { checksum: "abc" },
  };
  await t.sender("sections").sendMessages(sent);

  const receiver = t.receiver("sections", { receiveMode: "receiveAndDelete" });
  const [received] = await t.receiveAll(receiver, 1);
  const raw = received._rawAmqpMessage;
  assert.equal(raw.bodyType, "data");
  assert.deepEqual(received.body, sent.body);
  assert.deepEqual(raw.header, { ...sent.header, deliveryCount: 0 });
  assert.deepEqual(raw.properties, {
    ...sent.properties,
    // The client derives it from creationTime + timeToLive when sending.
    absoluteExpiryTime: creationTime + sent.header.timeToLive,
  });
  assert.deepEqual(raw.applicationProperties, sent.applicationProperties);
  const {
    "x-opt-sequence-number": seq,
    "x-opt-enqueued-time": enqueued,
    ...own
  } = raw.messageAnnotations;
  assert.deepEqual(own, sent.messageAnnotations, "the sender's annotations, unchanged");
  assert.ok(seq >= 1 && enqueued > 0, "plus the broker's");
  assert.deepEqual(raw.footer, sent.footer);
  assert.equal(raw.deliveryAnnotations, undefined, "delivery annotations stop at the broker");
};
