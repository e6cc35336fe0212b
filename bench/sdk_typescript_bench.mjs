#!/usr/bin/env node
// Claim + release latency through the TypeScript SDK (@sbx/client) against a raw
// @grpc/grpc-js client, in one run against one server, alternating blocks of each so
// that drift on the machine hits both alike. Prints percentiles; passes or fails nothing.
//
// Usage (the SDK built: scripts/install-deps, or npm ci --prefix clients/typescript):
//   node bench/sdk_typescript_bench.mjs [--server 127.0.0.1:50051] [--pool bench]
//        [--iterations 4000] [--warmup 400] [--block 200] [--concurrency 1]
// Each iteration claims a sandbox with a fresh claim id and releases it; the latency of
// an iteration is Claim's plus Release's, measured around the awaited calls.
import {createRequire} from 'node:module';
import path from 'node:path';
import {performance} from 'node:perf_hooks';
import {randomUUID} from 'node:crypto';
import {fileURLToPath} from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const pkg = path.join(root, 'clients/typescript');
const require = createRequire(path.join(pkg, 'package.json'));
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const {Client} = await import(path.join(pkg, 'dist/index.js'));

const args = {server: process.env.SBX_SERVER || '127.0.0.1:50051', pool: 'bench', iterations: 4000,
  warmup: 400, block: 200, concurrency: 1};
for (let i = 2; i < process.argv.length; i += 2) {
  const k = process.argv[i].replace(/^--/, '');
  if (!(k in args)) throw new Error(`unknown flag ${process.argv[i]}`);
  args[k] = typeof args[k] === 'number' ? Number(process.argv[i + 1]) : process.argv[i + 1];
}

// The raw client: what docs/api.md's Node.js example does, one channel, two calls.
const def = protoLoader.loadSync(['sbx/v1/claims.proto'], {includeDirs: [path.join(pkg, 'dist/proto')],
  keepCase: true, longs: String, enums: String, defaults: true, oneofs: true});
const raw = new (grpc.loadPackageDefinition(def).sbx.v1.ClaimService)(args.server, grpc.credentials.createInsecure());
const md = new grpc.Metadata();
if (process.env.SBX_TOKEN) md.set('authorization', `Bearer ${process.env.SBX_TOKEN}`);
const unary = (method, req) => new Promise((resolve, reject) =>
  raw[method](req, md, {deadline: new Date(Date.now() + 30000)}, (e, r) => (e ? reject(e) : resolve(r))));

const sdk = new Client({server: args.server});

const runners = {
  sdk: async () => {
    const sb = await sdk.claim(args.pool);
    await sb.release();
  },
  raw: async () => {
    const {claim} = await unary('Claim', {claim_id: randomUUID(), pool: args.pool});
    await unary('Release', {claim_id: claim.claim_id});
  },
};

async function block(name, n, out) {
  let next = 0;
  const worker = async () => {
    while (next < n) {
      next++;
      const t0 = performance.now();
      await runners[name]();
      out?.push(performance.now() - t0);
    }
  };
  await Promise.all(Array.from({length: args.concurrency}, worker));
}

const lat = {sdk: [], raw: []};
await block('sdk', args.warmup);
await block('raw', args.warmup);
const started = performance.now();
for (let done = 0; done < args.iterations; done += args.block) {
  const n = Math.min(args.block, args.iterations - done);
  // Alternate which one goes first.
  const order = (done / args.block) % 2 === 0 ? ['sdk', 'raw'] : ['raw', 'sdk'];
  for (const name of order) await block(name, n, lat[name]);
}
const seconds = (performance.now() - started) / 1000;

const pct = (xs, p) => xs[Math.min(xs.length - 1, Math.floor(p * xs.length))];
console.log(`server ${args.server} pool ${args.pool}: ${args.iterations} claim+release per client, ` +
            `concurrency ${args.concurrency}, blocks of ${args.block}, ${seconds.toFixed(1)} s`);
console.log('client   p50 ms   p90 ms   p99 ms   max ms   mean ms');
const summary = {};
for (const name of ['raw', 'sdk']) {
  const xs = lat[name].sort((a, b) => a - b);
  const mean = xs.reduce((a, b) => a + b, 0) / xs.length;
  summary[name] = {p50: pct(xs, 0.5), p99: pct(xs, 0.99)};
  console.log(`${name.padEnd(6)} ${[pct(xs, 0.5), pct(xs, 0.9), pct(xs, 0.99), xs[xs.length - 1], mean]
      .map((v) => v.toFixed(3).padStart(8)).join(' ')}`);
}
console.log(`sdk - raw: p50 ${(summary.sdk.p50 - summary.raw.p50).toFixed(3)} ms, ` +
            `p99 ${(summary.sdk.p99 - summary.raw.p99).toFixed(3)} ms`);
sdk.close();
raw.close();
