// A scheduled message at activation: Service Bus appends it "as if it had been enqueued at the
// current instant", with a new sequence number and that enqueued time (message sequencing), so
// a message sent after the schedule request but before activation comes first, and the
// scheduled message expires a time to live after its activation.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const sender = t.sender("reschedule");
  const activation = new Date(Date.now() + 1500);
  const [scheduledSeq] = await sender.scheduleMessages(
    { body: "scheduled", messageId: t.id("scheduled"), timeToLive: 60_000 },
    activation,
  );
  await sender.sendMessages({ body: "sent meanwhile", messageId: t.id("sent") });
  await t.sleep(activation.getTime() - Date.now() + 200);

  const receiver = t.receiver("reschedule", { receiveMode: "receiveAndDelete" });
  const received = await t.receiveAll(receiver, 2);
  assert.deepEqual(
    received.map((m) => m.messageId),
    [t.id("sent"), t.id("scheduled")],
    "the message sent while the other waited comes first",
  );
  const [sent, scheduled] = received;
  assert.ok(!scheduled.sequenceNumber.equals(scheduledSeq), "a new sequence number at activation");
  assert.ok(scheduled.sequenceNumber.greaterThan(sent.sequenceNumber));
  assert.ok(
    scheduled.enqueuedTimeUtc.getTime() >= activation.getTime(),
    "enqueuedTimeUtc is the activation's time",
  );
  assert.equal(scheduled.scheduledEnqueueTimeUtc.getTime(), activation.getTime());
  assert.equal(scheduled.expiresAtUtc.getTime(), scheduled.enqueuedTimeUtc.getTime() + 60_000);
};
