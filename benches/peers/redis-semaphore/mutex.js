// The driver's barging peer (section "peer"): node `redis-semaphore`'s Mutex, its default
// options (SET NX PX to acquire, a 10 ms retry interval, a compare-and-delete script to release),
// as one worker process of a multi-process run. The driver starts it as it starts its own child
// processes, with the same `key=value` arguments (name, counter, hold_us, start_ns, stop_ns,
// give_up_ns, first_worker, threads), and reads the same lines back:
//
//   rec WORKER REQ GOT REL DONE SEQ   one acquisition (ns on CLOCK_MONOTONIC, as the driver's;
//                                     GOT 0: a wait abandoned at the end)
//   error TEXT                        a failure
//   done                              the end
//
// Each worker loops acquire -> GET counter -> SET counter+1 -> hold -> release on a connection of
// its own; without a counter it loops acquire -> release (the uncontended pair).
'use strict';
const Redis = require('ioredis');
const { Mutex } = require('redis-semaphore');

const kv = Object.fromEntries(
  process.argv.slice(2).map((a) => {
    const i = a.indexOf('=');
    return [a.slice(0, i), a.slice(i + 1)];
  }),
);
// process.hrtime is CLOCK_MONOTONIC on Linux (libuv), the clock the driver's records use
const now = () => process.hrtime.bigint();
const sleepNs = (ns) => new Promise((r) => setTimeout(r, Math.max(0, Number(ns) / 1e6)));
const out = [];

async function worker(id) {
  const client = new Redis(kv.url, { lazyConnect: true });
  await client.connect();
  const [start, stop, giveUp] = [BigInt(kv.start_ns), BigInt(kv.stop_ns), BigInt(kv.give_up_ns)];
  const holdMs = Number(kv.hold_us) / 1000;
  try {
    if (now() > start) {
      // a late start would measure a shorter run than the driver divides by: say so
      throw new Error(`started ${Number(now() - start) / 1e6} ms after the run's start (node loads slowly on a busy machine)`);
    }
    await sleepNs(start - now());
    while (now() < stop) {
      const req = now();
      const acquireTimeout = Math.max(1, Number(giveUp - req) / 1e6);
      const mutex = new Mutex(client, kv.name, { acquireTimeout });
      if (!(await mutex.tryAcquire())) {
        out.push(`rec ${id} ${req} 0 0 0 -1`);
        break;
      }
      const got = now();
      let seq = -1;
      if (kv.counter) {
        seq = Number((await client.get(kv.counter)) || 0);
        await client.set(kv.counter, seq + 1);
      }
      if (holdMs > 0) await new Promise((r) => setTimeout(r, holdMs));
      const rel = now();
      await mutex.release();
      out.push(`rec ${id} ${req} ${got} ${rel} ${now()} ${seq}`);
    }
  } finally {
    client.disconnect();
  }
}

(async () => {
  const first = Number(kv.first_worker);
  const workers = Array.from({ length: Number(kv.threads) }, (_, i) =>
    worker(first + i).catch((e) => out.push(`error node worker ${first + i}: ${String(e && e.message ? e.message : e).replace(/\n/g, ' ')}`)),
  );
  await Promise.all(workers);
  out.push('done');
  // exit once written, whatever handle is left open
  process.stdout.write(out.join('\n') + '\n', () => process.exit(0));
})();
