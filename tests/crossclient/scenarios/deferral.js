// A deferred message leaves the normal receive path and is received again by its sequence
// number; unknown sequence numbers are refused with MessageNotFound.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  await t.sender("deferral").sendMessages([
    { body: "later", messageId: t.id("later") },
    { body: "now", messageId: t.id("now") },
  ]);
  const receiver = t.receiver("deferral");
  const [later, now] = await t.receiveAll(receiver, 2);
  await receiver.deferMessage(later);
  await receiver.completeMessage(now);
  await t.expectEmpty(receiver);

  const peeked = await receiver.peekMessages(5);
  assert.deepEqual(
    peeked.map((m) => m.messageId),
    [t.id("later")],
    "peek shows deferred messages",
  );

  const [deferred] = await receiver.receiveDeferredMessages(later.sequenceNumber);
  assert.equal(deferred.messageId, t.id("later"));
  assert.equal(deferred.sequenceNumber.toNumber(), later.sequenceNumber.toNumber());
  assert.ok(deferred.lockToken, "a deferred message received in peek-lock mode is locked");
  await receiver.completeMessage(deferred);

  await t.expectServiceBusError(
    receiver.receiveDeferredMessages(later.sequenceNumber),
    "MessageNotFound",
  );
  assert.deepEqual(await t.peekFromStart("deferral"), [], "completed");
};
