// A message id seen within the window is accepted and dropped: singly, inside one batch, and
// between scheduled and ordinary messages (they share the id space, both ways).
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const sender = t.sender("dedup");
  await sender.sendMessages({ body: "first", messageId: t.id("a") });
  await sender.sendMessages({ body: "second copy", messageId: t.id("a") });

  const batch = await sender.createMessageBatch();
  for (const id of ["b", "b", "c"]) {
    assert.ok(batch.tryAddMessage({ body: id, messageId: t.id(id) }));
  }
  await sender.sendMessages(batch);
  await sender.sendMessages([{ body: "again", messageId: t.id("c") }]);

  // Scheduled first, then sent: the send is the duplicate. Sent first, then scheduled: the
  // scheduled copy is.
  const soon = new Date(Date.now() + 1000);
  await sender.scheduleMessages({ body: "scheduled", messageId: t.id("d") }, soon);
  await sender.sendMessages({ body: "sent after", messageId: t.id("d") });
  await sender.sendMessages({ body: "sent", messageId: t.id("e") });
  await sender.scheduleMessages({ body: "scheduled after", messageId: t.id("e") }, soon);

  await t.sleep(1200);
  const receiver = t.receiver("dedup", { receiveMode: "receiveAndDelete" });
  const received = await t.receiveAll(receiver, 10, 2000);
  const byId = Object.fromEntries(received.map((m) => [m.messageId, m.body]));
  assert.equal(received.length, 5, `one copy per id, got ${received.map((m) => m.messageId)}`);
  assert.deepEqual(byId, {
    [t.id("a")]: "first",
    [t.id("b")]: "b",
    [t.id("c")]: "c",
    [t.id("d")]: "scheduled",
    [t.id("e")]: "sent",
  });
};
