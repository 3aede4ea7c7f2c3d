// A session is held by one receiver at a time: a second acceptSession is refused with
// SessionCannotBeLocked until the first receiver closes.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  await t.sender("exclusive").sendMessages({ body: "x", messageId: t.id("x"), sessionId: "held" });
  const holder = await t.acceptSession("exclusive", "held");

  const rival = t.newClient(); // another connection, as another process would have
  await t.expectServiceBusError(rival.acceptSession("exclusive", "held"), "SessionCannotBeLocked");

  const [message] = await t.receiveAll(holder, 1);
  assert.equal(message.messageId, t.id("x"));
  await holder.close(); // releases the session and the unsettled message

  const next = await t.acceptSession("exclusive", "held");
  const [again] = await t.receiveAll(next, 1);
  assert.equal(again.messageId, t.id("x"), "the released message is delivered again");
  assert.equal(again.deliveryCount, 1, "one delivery before this one");
  await next.completeMessage(again);
};
