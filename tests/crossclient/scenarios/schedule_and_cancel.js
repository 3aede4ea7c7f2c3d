// Scheduled messages stay invisible to receivers until their time, then arrive; a cancelled
// one never does.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const sender = t.sender("scheduling");
  const at = new Date(Date.now() + 2500);
  const [kept, cancelled] = await sender.scheduleMessages(
    [
      { body: "kept", messageId: t.id("kept") },
      { body: "cancelled", messageId: t.id("cancelled") },
    ],
    at,
  );
  assert.ok(kept.toNumber() > 0 && cancelled.toNumber() > 0, "sequence numbers returned");
  assert.notEqual(kept.toNumber(), cancelled.toNumber());
  await sender.cancelScheduledMessages(cancelled);

  const receiver = t.receiver("scheduling");
  const received = await t.receiveScheduled(receiver, 1, at);
  assert.deepEqual(
    received.map((m) => m.messageId),
    [t.id("kept")],
  );
  assert.equal(received[0].scheduledEnqueueTimeUtc.getTime(), at.getTime());
  await receiver.completeMessage(received[0]);
  await t.expectEmpty(receiver, 1000);
};
