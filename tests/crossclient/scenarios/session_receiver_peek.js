// Peek on a session receiver browses the receiver's session only (the peek request carries the
// session id), as Service Bus does.
// https://learn.microsoft.com/azure/service-bus-messaging/service-bus-amqp-request-response#message-operations
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const sender = t.sender("sessionpeek");
  await sender.sendMessages({ body: "mine", messageId: t.id("a1"), sessionId: "a" });
  await sender.sendMessages({ body: "other", messageId: t.id("b1"), sessionId: "b" });

  const receiver = t.acceptSession("sessionpeek", "a");
  const session = await receiver;
  const peeked = await session.peekMessages(10);
  const sessions = peeked.map((m) => m.sessionId);
  assert.ok(sessions.includes("a"), "the receiver's own session is peeked");
  assert.ok(!sessions.includes("b"), "another session's messages are not peeked");

  const [mine] = await t.receiveAll(session, 1);
  assert.equal(mine.messageId, t.id("a1"));
  await session.completeMessage(mine);
  await t.expectEmpty(session); // receive stays in the session: b1 never comes
};
