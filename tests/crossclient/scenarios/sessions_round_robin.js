// acceptNextSession hands out each session with messages once; two receivers take different
// sessions, and when none is left it times out with ServiceTimeout.
"use strict";

const assert = require("node:assert/strict");

module.exports.run = async (t) => {
  const sender = t.sender("roundrobin");
  const sessions = ["a", "b", "c"];
  for (const sessionId of sessions) {
    await sender.sendMessages(
      [0, 1].map((i) => ({ body: i, messageId: t.id(`${sessionId}-${i}`), sessionId })),
    );
  }

  const one = await t.acceptNextSession("roundrobin");
  const two = await t.acceptNextSession("roundrobin");
  assert.notEqual(one.sessionId, two.sessionId, "two receivers hold different sessions");
  const got = {};
  for (const receiver of [one, two]) {
    const messages = await t.receiveAll(receiver, 2);
    got[receiver.sessionId] = messages.map((m) => m.messageId);
    for (const m of messages) {
      await receiver.completeMessage(m);
    }
  }
  const third = await t.acceptNextSession("roundrobin", { receiveMode: "receiveAndDelete" });
  assert.ok(![one.sessionId, two.sessionId].includes(third.sessionId), "a third session");
  got[third.sessionId] = (await t.receiveAll(third, 2)).map((m) => m.messageId);

  assert.deepEqual(
    got,
    Object.fromEntries(sessions.map((s) => [s, [t.id(`${s}-0`), t.id(`${s}-1`)]])),
    "every session's messages went, in order, to the receiver holding it",
  );
  // The client asks the broker to wait for a session at most its operation timeout.
  const impatient = t.newClient({ retryOptions: { timeoutInMs: 1500 } });
  await t.expectServiceBusError(impatient.acceptNextSession("roundrobin"), "ServiceTimeout");
};
