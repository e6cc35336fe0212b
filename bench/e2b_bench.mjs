#!/usr/bin/env node
// Create + first command through the E2B SDK against sbx's E2B front, next to the same
// through sbx's TypeScript SDK and through raw @grpc/grpc-js calls, in one run against one
// server, alternating blocks of each so that drift on the machine hits all alike. Prints
// percentiles; passes or fails nothing.
//
// One iteration, timed:
//   e2b  Sandbox.create(pool) + sandbox.commands.run('echo hi')   (envd Start: bash -l -c)
//   sdk  client.claim(pool) + sandbox.exec(['/bin/bash', '-l', '-c', 'echo hi'])
//   raw  ClaimService.Claim + SandboxService.Exec of the same argv
// then, untimed, the sandbox is released (kill / release / Release). Every command is
// checked to print "hi". Between blocks the run waits `--pause_ms` so that the pool refills
// (claims then come warm: this measures the claim path, not sandbox creation).
//
// Usage (scripts/install-deps first: tests/e2b and clients/typescript node_modules):
//   sbx-server --config CONFIG --e2b_listen 127.0.0.1:3000 --insecure_no_auth ...
//   node bench/e2b_bench.mjs --server 127.0.0.1:50051 --e2b http://127.0.0.1:3000 \
//        --pool default [--iterations 200] [--warmup 20] [--block 10] [--pause_ms 1500]
import {createRequire} from 'node:module';
import path from 'node:path';
import {performance} from 'node:perf_hooks';
import {randomUUID} from 'node:crypto';
import {setTimeout as sleep} from 'node:timers/promises';
import {fileURLToPath} from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const pkg = path.join(root, 'clients/typescript');
const require = createRequire(path.join(pkg, 'package.json'));
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const {Client} = await import(path.join(pkg, 'dist/index.js'));
const {Sandbox} = await import(path.join(root, 'tests/e2b/node_modules/e2b/dist/index.mjs'));

const args = {server: '127.0.0.1:50051', e2b: 'http://127.0.0.1:3000', pool: 'default',
  iterations: 200, warmup: 20, block: 10, pause_ms: 1500, token: process.env.SBX_TOKEN || 'bench'};
for (let i = 2; i < process.argv.length; i += 2) {
  const k = process.argv[i].replace(/^--/, '');
  if (!(k in args)) throw new Error(`unknown flag ${process.argv[i]}`);
  args[k] = typeof args[k] === 'number' ? Number(process.argv[i + 1]) : process.argv[i + 1];
}
process.env.E2B_API_URL = args.e2b;
process.env.E2B_SANDBOX_URL = args.e2b;
process.env.E2B_API_KEY = args.token;

const argv = ['/bin/bash', '-l', '-c', 'echo hi'];
const def = protoLoader.loadSync(['sbx/v1/claims.proto', 'sbx/v1/sandboxes.proto'],
  {includeDirs: [path.join(pkg, 'dist/proto')], keepCase: true, longs: String, enums: String,
   defaults: true, oneofs: true});
const v1 = grpc.loadPackageDefinition(def).sbx.v1;
const claims = new v1.ClaimService(args.server, grpc.credentials.createInsecure());
const sandboxes = new v1.SandboxService(args.server, grpc.credentials.createInsecure());
const md = new grpc.Metadata();
md.set('authorization', `Bearer ${args.token}`);
const deadline = () => ({deadline: new Date(Date.now() + 30000)});
const unary = (svc, method, req) => new Promise((resolve, reject) =>
  svc[method](req, md, deadline(), (e, r) => (e ? reject(e) : resolve(r))));
const rawExec = (claimId) => new Promise((resolve, reject) => {
  const call = sandboxes.Exec(md, deadline());
  let out = '';
  call.on('data', (m) => { if (m.stdout_chunk) out += Buffer.from(m.stdout_chunk).toString(); });
  call.on('error', reject);
  call.on('end', () => resolve(out));
  call.write({start: {claim_id: claimId, argv}});
  call.end();
});

const sdk = new Client({server: args.server, token: args.token});
const check = (out, who) => { if (out !== 'hi\n') throw new Error(`${who}: output ${JSON.stringify(out)}`); };

const runners = {
  e2b: async () => {
    const t0 = performance.now();
    const sbx = await Sandbox.create(args.pool, {timeoutMs: 120_000});
    const r = await sbx.commands.run('echo hi');
    const t = performance.now() - t0;
    check(r.stdout, 'e2b');
    await sbx.kill();
    return t;
  },
  sdk: async () => {
    const t0 = performance.now();
    const sb = await sdk.claim(args.pool);
    const r = await sb.exec(argv);
    const t = performance.now() - t0;
    check(r.stdout, 'sdk');
    await sb.release();
    return t;
  },
  raw: async () => {
    const t0 = performance.now();
    const {claim} = await unary(claims, 'Claim', {claim_id: randomUUID(), pool: args.pool});
    const out = await rawExec(claim.claim_id);
    const t = performance.now() - t0;
    check(out, 'raw');
    await unary(claims, 'Release', {claim_id: claim.claim_id});
    return t;
  },
};

async function block(name, n, out) {
  for (let i = 0; i < n; i++) {
    const t = await runners[name]();
    out?.push(t);
  }
  await sleep(args.pause_ms);
}

const lat = {e2b: [], sdk: [], raw: []};
const names = Object.keys(lat);
for (const name of names) await block(name, args.warmup);
for (let done = 0, round = 0; done < args.iterations; done += args.block, round++) {
  const n = Math.min(args.block, args.iterations - done);
  // Rotate which one goes first.
  for (let k = 0; k < names.length; k++) {
    const name = names[(k + round) % names.length];
    await block(name, n, lat[name]);
  }
}
const pct = (xs, p) => xs[Math.min(xs.length - 1, Math.floor(p * xs.length))];
console.log(`server ${args.server} e2b ${args.e2b} pool ${args.pool}: ${args.iterations} ` +
            'create + first command each, ms');
console.log('| client | p50 | p90 | p99 | max |');
console.log('|---|---|---|---|---|');
for (const name of names) {
  const xs = lat[name].sort((a, b) => a - b);
  console.log(`| ${name} | ${[0.5, 0.9, 0.99].map((p) => pct(xs, p).toFixed(2)).join(' | ')} | ` +
              `${xs[xs.length - 1].toFixed(2)} |`);
}
const p50 = (n) => pct(lat[n].sort((a, b) => a - b), 0.5);
console.log(`e2b / sdk at p50: ${(p50('e2b') / p50('sdk')).toFixed(2)}x; ` +
            `sdk / raw at p50: ${(p50('sdk') / p50('raw')).toFixed(2)}x`);
process.exit(0);
