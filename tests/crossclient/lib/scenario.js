// What every scenario gets: its client, links closed for it, and the checks the suite shares.
"use strict";

const assert = require("node:assert/strict");
const { ServiceBusClient, isServiceBusError } = require("@azure/service-bus");

class KnownDivergenceFixed extends Error {}

class Scenario {
  constructor(name, client, connectionString, operationTimeoutMs) {
    this.name = name;
    this.operationTimeoutMs = operationTimeoutMs;
    this.client = client;
    this.connectionString = connectionString;
    this.links = [];
  }

  /** A message id unique to this scenario, so runs and scenarios never deduplicate each other. */
  id(suffix) {
    return `${this.name}/${suffix}`;
  }

  /** Another client (its own connection), e.g. with other retry options; closed at the end. */
  newClient(options = {}) {
    return this.track(
      new ServiceBusClient(this.connectionString, {
        ...options,
        retryOptions: {
          maxRetries: 0,
          timeoutInMs: this.operationTimeoutMs,
          ...options.retryOptions,
        },
      }),
    );
  }

  sender(entity) {
    return this.track(this.client.createSender(entity));
  }

  /** A receiver; `receiver(topic, subscription, options)` for a subscription. */
  receiver(entity, ...rest) {
    return this.track(this.client.createReceiver(entity, ...rest));
  }

  async acceptSession(entity, sessionId, options) {
    return this.track(await this.client.acceptSession(entity, sessionId, options));
  }

  async acceptNextSession(entity, options) {
    return this.track(await this.client.acceptNextSession(entity, options));
  }

  track(link) {
    this.links.push(link);
    return link;
  }

  async closeAll() {
    for (const link of this.links.reverse()) {
      await link.close().catch(() => undefined);
    }
  }

  /**
   * Peeks an entity from its first message, through a new receiver: a receiver's own peeks
   * continue after the last message it peeked, so reusing one can hide messages.
   */
  async peekFromStart(entity, ...rest) {
    return this.receiver(entity, ...rest).peekMessages(100);
  }

  /** Polls peekFromStart until the entity is empty (settlements still in flight land). */
  async expectDrained(entity, ...rest) {
    let left = [];
    for (let attempt = 0; attempt < 25; attempt += 1) {
      left = await this.peekFromStart(entity, ...rest);
      if (left.length === 0) {
        return;
      }
      await this.sleep(200);
    }
    assert.deepEqual(
      left.map((m) => m.messageId),
      [],
      `${entity}: messages left after 5 s`,
    );
  }

  /**
   * Receives until `count` messages arrived or `waitMs` passed with nothing new, one message per
   * receive call. A call that ends by its message arriving leaves the client no credit to
   * drain; a call that ends by its timer drains, and when the broker answers the drain later
   * than the client's fixed 200 ms the client closes the link, losing every lock it holds (and
   * a session receiver's session). So no scenario drains while it holds a lock it will settle:
   * it receives what it expects, settles, then checks that nothing more comes (expectEmpty).
   */
  async receiveAll(receiver, count, waitMs = 10_000) {
    const received = [];
    while (received.length < count) {
      const [message] = await receiver.receiveMessages(1, { maxWaitTimeInMs: waitMs });
      if (message === undefined) {
        break;
      }
      received.push(message);
    }
    return received;
  }

  /**
   * Receives `count` messages scheduled for `at`, asserting that none arrives before then;
   * gives up 20 s after `at`. Each receive call waits for its message (no timer ends it early,
   * so the client never drains credit while a due message may be on its way: receiveAll).
   */
  async receiveScheduled(receiver, count, at) {
    const giveUp = at.getTime() + 20_000;
    const received = [];
    while (received.length < count && Date.now() < giveUp) {
      const [message] = await receiver.receiveMessages(1, {
        maxWaitTimeInMs: Math.max(1, giveUp - Date.now()),
      });
      if (message === undefined) {
        break;
      }
      assert.ok(
        Date.now() >= at.getTime() - 50,
        `${message.messageId} received before ${at.toISOString()}`,
      );
      received.push(message);
    }
    return received;
  }

  /**
   * Asserts that nothing can be received now (a short wait: the entity is this scenario's).
   * The receive ends by its timer, so the client drains (receiveAll): call it once the
   * scenario holds no lock it will settle, and last on a session receiver.
   */
  async expectEmpty(receiver, waitMs = 500) {
    const extra = await receiver.receiveMessages(10, { maxWaitTimeInMs: waitMs });
    assert.deepEqual(
      extra.map((m) => m.messageId),
      [],
      `${receiver.entityPath}: expected no more messages`,
    );
  }

  /** Awaits `promise`: the error it failed with, or undefined when it succeeded. */
  async errorOf(promise) {
    try {
      await promise;
      return undefined;
    } catch (err) {
      return err;
    }
  }

  /** Awaits `promise` and asserts it fails with a ServiceBusError of `code`; returns the error. */
  async expectServiceBusError(promise, code) {
    const error = await this.errorOf(promise);
    assert.ok(error, `expected a ServiceBusError ${code}, but the call succeeded`);
    assert.ok(
      isServiceBusError(error),
      `expected a ServiceBusError ${code}, got ${error && error.name}: ${error && error.message}`,
    );
    assert.equal(error.code, code, `error code (message: ${error.message})`);
    return error;
  }

  /**
   * Asserts today's behaviour of a known divergence (listed in docs/emulator.md). When the
   * emulator is fixed this check fails, naming the divergence, so the table and the scenario
   * get updated together.
   */
  stillDiverges(condition, what) {
    if (!condition) {
      throw new KnownDivergenceFixed(
        `known divergence no longer observed: ${what}. If the emulator now behaves as Service ` +
          "Bus documents, remove the row from docs/emulator.md's divergence table and make " +
          "this scenario assert the documented behaviour.",
      );
    }
  }

  /**
   * The short lock of the lock scenarios' entities ("short_lock" in entities.json), as the
   * runner was told (CROSSCLIENT_LOCK_DURATION_MS); other entities lock for 60 s.
   */
  get lockDurationMs() {
    return Number(process.env.CROSSCLIENT_LOCK_DURATION_MS || "5000");
  }

  /**
   * Asserts that `until` is one lock duration after the broker handled a call made between
   * `before` and `after` (epoch ms): a bound, not a speed, so a loaded machine cannot fail it.
   */
  assertLockedFor(until, before, after, what) {
    const slack = 1000; // clock reading granularity on both sides
    const lock = this.lockDurationMs;
    assert.ok(
      until.getTime() >= before + lock - slack && until.getTime() <= after + lock + slack,
      `${what}: locked until ${until.toISOString()}, not ${lock} ms after the call ` +
        `(${new Date(before).toISOString()} .. ${new Date(after).toISOString()})`,
    );
  }

  sleep(ms) {
    return new Promise((resolve) => setTimeout(resolve, ms));
  }
}

module.exports = { Scenario, KnownDivergenceFixed };
