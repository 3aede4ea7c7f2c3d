// Known divergence: a scheduled message at activation. Service Bus appends it "as if it had been
// enqueued at the current instant", with a new sequence number and that enqueued time; the
// emulator keeps the sequence number and enqueued time of the schedule request, so a message
// sent after the request but before activation comes after it in sequence order.
"use strict";

const assert = require("node:assert/strict");

module.exports.divergence =
  "https://learn.microsoft.com/azure/service-bus-messaging/message-sequencing#scheduled-messages";

module.exports.run = async (t) => {
  const sender = t.sender("reschedule");
  const requested = Date.now();
  const activation = new Date(requested + 1500);
  const [scheduledSeq] = await sender.scheduleMessages(
    { body: "scheduled", messageId: t.id("scheduled"), timeToLive: 60_000 },
    activation,
  );
  await sender.sendMessages({ body: "sent meanwhile", messageId: t.id("sent") });
  await t.sleep(activation.getTime() - Date.now() + 200);

  const receiver = t.receiver("reschedule", { receiveMode: "receiveAndDelete" });
  const received = await t.receiveAll(receiver, 2);
  const byId = Object.fromEntries(received.map((m) => [m.messageId, m]));
  const scheduled = byId[t.id("scheduled")];
  const sent = byId[t.id("sent")];
  assert.ok(scheduled && sent, "both messages received");

  t.stillDiverges(
    scheduled.sequenceNumber.equals(scheduledSeq),
    "the activated message keeps the schedule request's sequence number (no new one)",
  );
  t.stillDiverges(
    scheduled.sequenceNumber.lessThan(sent.sequenceNumber),
    "the activated message sorts before a message sent while it waited",
  );
  t.stillDiverges(
    scheduled.enqueuedTimeUtc.getTime() < activation.getTime(),
    "enqueuedTimeUtc is the schedule request's time, not the activation's",
  );
  // expiresAtUtc follows enqueuedTimeUtc: it comes ~the scheduling delay early.
  assert.equal(scheduled.expiresAtUtc.getTime(), scheduled.enqueuedTimeUtc.getTime() + 60_000);
};
