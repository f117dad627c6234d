// scripts/bench.sh's peer: node `redis-semaphore`'s Semaphore (one permit, its default options:
// a 10 ms retry interval), measured as the driver measures fairlock's semaphore: the hand-off
// between two workers taking turns (release started -> the other's acquire returned, hold 2 ms),
// and the acquisitions per second of 8 workers with hold 0, on one connection each.
//
//   node handoff.js REDIS_URL HANDOFFS THROUGHPUT_SECONDS OUT_JSON
'use strict';
const Redis = require('ioredis');
const { Semaphore } = require('redis-semaphore');

const [url, handoffs = '200', secs = '4', out] = process.argv.slice(2);
const now = () => Number(process.hrtime.bigint()) / 1000; // µs
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function pct(sorted, p) {
  return sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor((sorted.length * p) / 100))] : null;
}

async function rtt(client) {
  const xs = [];
  for (let i = 0; i < 300; i++) {
    const t = now();
    await client.ping();
    xs.push(now() - t);
  }
  xs.sort((a, b) => a - b);
  return pct(xs, 50);
}

async function handoff(n) {
  const key = `bench-peer-handoff-${process.pid}`;
  const clients = [new Redis(url), new Redis(url)];
  const events = []; // [worker, 'acq' | 'rel', µs]
  let left = n + 1;
  await Promise.all(
    clients.map(async (client, w) => {
      while (left > 0) {
        const sem = new Semaphore(client, key, 1, { acquireTimeout: 30000 });
        await sem.acquire();
        events.push([w, 'acq', now()]);
        left--;
        await sleep(2);
        events.push([w, 'rel', now()]);
        await sem.release();
        await sleep(0); // let the other worker's retry timer run
      }
    }),
  );
  const lat = [];
  for (let i = 1; i < events.length; i++) {
    const [w, kind, t] = events[i];
    if (kind !== 'acq') continue;
    // the latest release by the other worker before this acquisition
    for (let j = i - 1; j >= 0; j--) {
      if (events[j][1] === 'rel' && events[j][0] !== w) {
        lat.push(t - events[j][2]);
        break;
      }
      if (events[j][1] === 'acq') break;
    }
  }
  await Promise.all(clients.map((c) => c.quit()));
  lat.sort((a, b) => a - b);
  return { n: lat.length, p50_us: pct(lat, 50), p99_us: pct(lat, 99), max_us: lat[lat.length - 1] };
}

async function throughput(seconds, workers) {
  const key = `bench-peer-throughput-${process.pid}`;
  const clients = Array.from({ length: workers }, () => new Redis(url));
  const counts = new Array(workers).fill(0);
  const stop = now() + seconds * 1e6;
  await Promise.all(
    clients.map(async (client, w) => {
      while (now() < stop) {
        const sem = new Semaphore(client, key, 1, { acquireTimeout: 30000 });
        await sem.acquire();
        counts[w]++;
        await sem.release();
      }
    }),
  );
  await Promise.all(clients.map((c) => c.quit()));
  const total = counts.reduce((a, b) => a + b, 0);
  const sumsq = counts.reduce((a, b) => a + b * b, 0);
  return { workers, acq_per_s: total / seconds, jain: total ? (total * total) / (workers * sumsq) : null };
}

(async () => {
  const ping = new Redis(url);
  const rtt_us = await rtt(ping);
  await ping.quit();
  const h = await handoff(Number(handoffs));
  const t = await throughput(Number(secs), 8);
  const result = { lock: 'node redis-semaphore 5.8.0 (Semaphore, 1 permit)', rtt_us, handoff: h, throughput: t };
  if (out) require('fs').writeFileSync(out, JSON.stringify(result, null, 2) + '\n');
  const r = (v) => (v === null ? '-' : Math.round(v));
  console.log('### Peer: node redis-semaphore (same server, after the driver)\n');
  console.log('| lock | hand-off p50 µs | p99 µs | RTT µs | p50 / RTT | 8 workers, hold 0: acq/s | Jain |');
  console.log('|---|---:|---:|---:|---:|---:|---:|');
  console.log(`| ${result.lock} | ${r(h.p50_us)} | ${r(h.p99_us)} | ${r(rtt_us)} | ${(h.p50_us / rtt_us).toFixed(1)} | ${r(t.acq_per_s)} | ${t.jain === null ? '-' : t.jain.toFixed(3)} |\n`);
})().catch((e) => {
  console.error(`redis-semaphore peer: ${e && e.message ? e.message : e}`);
  process.exit(1);
});
