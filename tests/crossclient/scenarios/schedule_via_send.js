// A message sent with scheduledEnqueueTimeUtc (rather than through scheduleMessages) is held
// until that time: a queue's peek shows it, receivers get it only once due.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const at = new Date(Date.now() + 1500);
  await t.sender("sendlater").sendMessages({
    body: "later",
    messageId: t.id("later"),
    scheduledEnqueueTimeUtc: at,
  });
  const receiver = t.receiver("sendlater");
  assert.deepEqual(
    (await receiver.peekMessages(5)).map((m) => m.messageId),
    [t.id("later")],
  );
  const [due] = await t.receiveScheduled(receiver, 1, at);
  assert.equal(due.messageId, t.id("later"));
  assert.equal(due.scheduledEnqueueTimeUtc.getTime(), at.getTime());
  await receiver.completeMessage(due);
};
