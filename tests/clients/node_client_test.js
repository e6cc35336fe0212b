#!/usr/bin/env node
// Independent Node.js client test for sbx-server.
//
// Starts the server binary itself on 127.0.0.1:0, talks to it only through the public
// sbx.v1 protos (loaded with @grpc/proto-loader, no generated code) and the standard
// grpc.health.v1 / grpc.reflection.v1alpha services, then stops it with SIGTERM.
//
// Usage: node node_client_test.js <path/to/sbx-server> <proto dir> [extra server flags...]
//   or:  SBX_SERVER=... SBX_PROTO_DIR=... [SBX_SERVER_FLAGS='...'] node node_client_test.js
// Exit status 0 when every check passed, 1 otherwise. The server is killed on any
// failure, including an uncaught error or an interrupt of this script.

'use strict';

const childProcess = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');

const kNodeModules = path.join(__dirname, 'node_modules');
const kPortFileTimeoutMs = 20000;
const kShutdownTimeoutMs = 10000;
const kCallDeadlineMs = 10000;
const kMiB = 1024 * 1024;

function fatal(message) {
  console.error(`FAIL: ${message}`);
  process.exit(1);
}

// The dependencies must come from tests/clients/node_modules (installed by
// scripts/install-deps with `npm ci`); never fall back to whatever a parent directory or
// a global install happens to hold, and never skip.
for (const dep of ['@grpc/grpc-js', '@grpc/proto-loader', '@grpc/reflection', 'grpc-health-check']) {
  if (!fs.existsSync(path.join(kNodeModules, dep, 'package.json'))) {
    fatal(`${path.join(kNodeModules, dep)} is missing: run \`npm ci --prefix tests/clients\` ` +
          'from the repository root (scripts/install-deps does this)');
  }
}
const grpc = require(path.join(kNodeModules, '@grpc/grpc-js'));
const protoLoader = require(path.join(kNodeModules, '@grpc/proto-loader'));

const serverBinary = process.argv[2] || process.env.SBX_SERVER;
const protoDir = process.argv[3] || process.env.SBX_PROTO_DIR;
const extraServerFlags = process.argv.length > 4 ?
    process.argv.slice(4) : (process.env.SBX_SERVER_FLAGS || '').split(/\s+/).filter(Boolean);
if (!serverBinary || !protoDir) {
  fatal('usage: node node_client_test.js <sbx-server binary> <proto dir> [server flags...]');
}
if (!fs.existsSync(serverBinary)) fatal(`server binary "${serverBinary}" does not exist`);
// Absolute, because the server runs in a temp dir.
const serverPath = path.resolve(serverBinary);
if (!fs.existsSync(path.join(protoDir, 'sbx', 'v1'))) {
  fatal(`proto dir "${protoDir}" has no sbx/v1 subdirectory`);
}

// ---------------------------------------------------------------------------------------
// Server process management.

let server = null;         // ChildProcess while it may be running
let serverExit = null;     // {code, signal} once it exited
let serverLog = '';        // stdout + stderr, for failure reports
let tmpDir = null;

// Kills the server's whole process group (the server and anything it started, e.g.
// local sandboxes), whether or not the server itself is still running.
function killServer() {
  if (server && server.pid) {
    try {
      process.kill(-server.pid, 'SIGKILL');
    } catch (e) {
      // The group is already empty.
    }
  }
}

function cleanUp() {
  killServer();
  if (tmpDir) {
    fs.rmSync(tmpDir, {recursive: true, force: true});
    tmpDir = null;
  }
}

process.on('exit', cleanUp);
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.on(sig, () => {
    console.error(`interrupted by ${sig}; killing the server`);
    cleanUp();
    process.exit(1);
  });
}
process.on('uncaughtException', (err) => {
  console.error(`FAIL: uncaught error: ${err && err.stack ? err.stack : err}`);
  dumpServerLog();
  cleanUp();
  process.exit(1);
});

function dumpServerLog() {
  if (serverLog.length === 0) return;
  const tail = serverLog.length > 8192 ? serverLog.slice(-8192) : serverLog;
  console.error('---- sbx-server output (tail) ----');
  console.error(tail.trimEnd());
  console.error('---- end of sbx-server output ----');
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// Starts the server and resolves with its port once it has written the port file.
async function startServer() {
  tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'sbx-node-client-'));
  const portFile = path.join(tmpDir, 'port');
  const args = ['--listen=127.0.0.1:0', `--port_file=${portFile}`, ...extraServerFlags];
  console.log(`starting ${serverPath} ${args.join(' ')}`);
  // cwd is the temp dir so that anything the server writes by default stays there. The
  // server leads its own process group so that clean-up can kill everything it started.
  server = childProcess.spawn(serverPath, args,
                              {cwd: tmpDir, detached: true, stdio: ['ignore', 'pipe', 'pipe']});
  server.stdout.on('data', (d) => { serverLog += d.toString(); });
  server.stderr.on('data', (d) => { serverLog += d.toString(); });
  server.on('exit', (code, signal) => { serverExit = {code, signal}; });
  server.on('error', (err) => {
    serverExit = {code: null, signal: null, error: err};
  });

  const deadline = Date.now() + kPortFileTimeoutMs;
  while (Date.now() < deadline) {
    if (serverExit !== null) {
      throw new Error(`server exited before serving: ${describeExit(serverExit)}`);
    }
    let text = null;
    try {
      text = fs.readFileSync(portFile, 'utf8');
    } catch (e) {
      // Not written yet.
    }
    if (text !== null) {
      const m = /^\s*(\d+)\s*$/.exec(text);
      if (m) {
        const port = Number(m[1]);
        if (port > 0 && port < 65536) return port;
        throw new Error(`port file holds an invalid port: ${JSON.stringify(text)}`);
      }
      // Possibly half-written; read again.
    }
    await sleep(50);
  }
  throw new Error(`server did not write ${portFile} within ${kPortFileTimeoutMs / 1000} s`);
}

function describeExit(e) {
  if (!e) return 'still running';
  if (e.error) return `spawn error: ${e.error.message}`;
  return e.signal ? `killed by ${e.signal}` : `exit code ${e.code}`;
}

function waitForExit(timeoutMs) {
  if (serverExit !== null) return Promise.resolve(serverExit);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(null), timeoutMs);
    server.once('exit', (code, signal) => {
      clearTimeout(timer);
      resolve({code, signal});
    });
  });
}

// ---------------------------------------------------------------------------------------
// Protos and clients.

const kLoaderOptions = {keepCase: true, longs: String, enums: String, defaults: true, oneofs: true};

function loadSbxProtos() {
  const dir = path.join(protoDir, 'sbx', 'v1');
  const files = fs.readdirSync(dir).filter((f) => f.endsWith('.proto')).sort()
      .map((f) => `sbx/v1/${f}`);
  const def = protoLoader.loadSync(files, {...kLoaderOptions, includeDirs: [protoDir]});
  return grpc.loadPackageDefinition(def);
}

function loadStandardProto(relPath) {
  const file = path.join(kNodeModules, relPath);
  if (!fs.existsSync(file)) throw new Error(`${file} is missing (npm package layout changed?)`);
  const def = protoLoader.loadSync(file, kLoaderOptions);
  return grpc.loadPackageDefinition(def);
}

function deadline(ms = kCallDeadlineMs) {
  return new Date(Date.now() + ms);
}

// Promisified unary call: resolves with {err, res} so that checks can inspect errors.
function unary(client, method, request, ms) {
  return new Promise((resolve) => {
    client[method](request, {deadline: deadline(ms)}, (err, res) => resolve({err, res}));
  });
}

function codeName(code) {
  for (const [name, value] of Object.entries(grpc.status)) {
    if (value === code) return name;
  }
  return String(code);
}

// ---------------------------------------------------------------------------------------
// Checks.

const results = [];

async function check(name, fn) {
  try {
    const detail = await fn();
    results.push({name, ok: true});
    console.log(`ok   - ${name}${detail ? ` (${detail})` : ''}`);
  } catch (err) {
    results.push({name, ok: false});
    console.log(`FAIL - ${name}: ${err && err.message ? err.message : err}`);
  }
}

function assert(cond, message) {
  if (!cond) throw new Error(message);
}

const kExpectedMethods = {
  ClaimService: ['Claim', 'ClaimBatch', 'Release', 'Renew', 'GetClaim', 'ListClaims',
                 'WatchClaims'],
  SandboxService: ['Exec', 'WriteFile', 'ReadFile', 'ListFiles', 'Suspend', 'Resume'],
  AdminService: ['PutTemplate', 'GetTemplate', 'ListTemplates', 'DeleteTemplate', 'PutPool',
                 'GetPool', 'ListPools', 'DeletePool', 'ScalePool', 'WatchPools'],
  DiagnosticsService: ['Ping'],
};

async function main() {
  // The protos are checked before the server starts: a broken API file is reported as
  // such, not as a server failure.
  let sbx = null;
  await check('protos load with @grpc/proto-loader and define every sbx.v1 service', () => {
    sbx = loadSbxProtos().sbx.v1;
    for (const [service, methods] of Object.entries(kExpectedMethods)) {
      assert(sbx[service] && sbx[service].service, `service sbx.v1.${service} missing`);
      const have = Object.keys(sbx[service].service).sort();
      assert(JSON.stringify(have) === JSON.stringify([...methods].sort()),
             `sbx.v1.${service} has methods ${have.join(',')}, want ${methods.join(',')}`);
    }
    const exec = sbx.SandboxService.service.Exec;
    assert(exec.requestStream && exec.responseStream, 'SandboxService.Exec is not bidi');
    const watch = sbx.ClaimService.service.WatchClaims;
    assert(!watch.requestStream && watch.responseStream, 'WatchClaims is not server-streaming');
    return `${Object.keys(kExpectedMethods).length} services`;
  });
  if (!sbx) return;

  const port = await startServer();
  const target = `127.0.0.1:${port}`;
  console.log(`server is serving on ${target} (pid ${server.pid})`);
  const creds = grpc.credentials.createInsecure();

  const health = loadStandardProto('grpc-health-check/proto/health/v1/health.proto');
  const healthClient = new health.grpc.health.v1.Health(target, creds);
  const reflection = loadStandardProto(
      '@grpc/reflection/build/proto/grpc/reflection/v1alpha/reflection.proto');
  const reflectionClient =
      new reflection.grpc.reflection.v1alpha.ServerReflection(target, creds);
  const diagnostics = new sbx.DiagnosticsService(target, creds);
  const sandboxes = new sbx.SandboxService(target, creds);
  const clients = [healthClient, reflectionClient, diagnostics, sandboxes];

  await check('(a) grpc.health.v1.Health/Check service "" is SERVING', async () => {
    const {err, res} = await unary(healthClient, 'Check', {service: ''});
    if (err) throw new Error(`Check failed: ${codeName(err.code)}: ${err.details}`);
    assert(res.status === 'SERVING', `status is ${res.status}, want SERVING`);
  });

  await check('(b) DiagnosticsService.Ping echoes the payload and reports a version', async () => {
    const payload = Buffer.from(`hello sbx ${process.pid} \u00e9\x00\xff`, 'latin1');
    const {err, res} = await unary(diagnostics, 'Ping', {payload});
    if (err) throw new Error(`Ping failed: ${codeName(err.code)}: ${err.details}`);
    assert(Buffer.compare(Buffer.from(res.payload), payload) === 0,
           `payload came back as ${Buffer.from(res.payload).toString('hex')}`);
    assert(typeof res.server_version === 'string' && res.server_version.length > 0,
           'server_version is empty');
    assert(res.server_time && Number(res.server_time.seconds) > 0, 'server_time is unset');
    return `server_version=${res.server_version} server_commit=${res.server_commit}`;
  });

  await check('(b2) Ping with a payload of exactly 1 MiB succeeds', async () => {
    const payload = Buffer.alloc(kMiB, 0x5a);
    const {err, res} = await unary(diagnostics, 'Ping', {payload}, 30000);
    if (err) throw new Error(`Ping(1 MiB) failed: ${codeName(err.code)}: ${err.details}`);
    assert(Buffer.compare(Buffer.from(res.payload), payload) === 0, 'payload differs');
  });

  await check('(c) reflection lists ClaimService, DiagnosticsService and Health', async () => {
    const names = await new Promise((resolve, reject) => {
      const call = reflectionClient.ServerReflectionInfo({deadline: deadline()});
      let got = null;
      call.on('data', (msg) => {
        if (msg.error_response) {
          reject(new Error(`error_response ${msg.error_response.error_code}: ` +
                           `${msg.error_response.error_message}`));
          return;
        }
        if (msg.list_services_response) {
          got = msg.list_services_response.service.map((s) => s.name);
          call.end();
        }
      });
      call.on('error', (err) => reject(new Error(`${codeName(err.code)}: ${err.details}`)));
      call.on('end', () => (got ? resolve(got) : reject(new Error('no list_services_response'))));
      call.write({list_services: '*'});
    });
    for (const want of ['sbx.v1.ClaimService', 'sbx.v1.DiagnosticsService', 'grpc.health.v1.Health']) {
      assert(names.includes(want), `${want} not listed; got [${names.join(', ')}]`);
    }
    return names.sort().join(', ');
  });

  await check('(c2) reflection returns the file descriptor of sbx.v1.ClaimService', async () => {
    const files = await new Promise((resolve, reject) => {
      const call = reflectionClient.ServerReflectionInfo({deadline: deadline()});
      let got = null;
      call.on('data', (msg) => {
        if (msg.error_response) {
          reject(new Error(`error_response ${msg.error_response.error_code}: ` +
                           `${msg.error_response.error_message}`));
          return;
        }
        if (msg.file_descriptor_response) {
          got = msg.file_descriptor_response.file_descriptor_proto;
          call.end();
        }
      });
      call.on('error', (err) => reject(new Error(`${codeName(err.code)}: ${err.details}`)));
      call.on('end', () => (got ? resolve(got) : reject(new Error('no file_descriptor_response'))));
      call.write({file_containing_symbol: 'sbx.v1.ClaimService'});
    });
    assert(files.length > 0, 'no file descriptors');
    // Serialized FileDescriptorProtos: the package name and the service name must appear
    // as strings (field 2 package, service[].name). Shown readably on failure.
    const all = Buffer.concat(files.map((f) => Buffer.from(f)));
    const readable = all.toString('latin1').replace(/[^\x20-\x7e]+/g, ' ').slice(0, 200);
    for (const want of ['sbx.v1', 'ClaimService', 'WatchClaims']) {
      assert(all.includes(Buffer.from(want)), `"${want}" not in the descriptors: ${readable}`);
    }
    return `${files.length} descriptor(s)`;
  });

  await check('(d) SandboxService.ReadFile (not implemented yet) is UNIMPLEMENTED with a message',
              async () => {
    const {err} = await unary(sandboxes, 'ReadFile', {
      claim_id: 'node-client-test-1',
      path: 'main.py',
    });
    assert(err, 'ReadFile succeeded, want UNIMPLEMENTED');
    assert(err.code === grpc.status.UNIMPLEMENTED,
           `status ${codeName(err.code)} (${err.details}), want UNIMPLEMENTED`);
    assert(typeof err.details === 'string' && err.details.trim().length > 0,
           'status message is empty');
    return `"${err.details}"`;
  });

  await check('(e) Ping with a payload of 1 MiB + 1 bytes is rejected', async () => {
    const payload = Buffer.alloc(kMiB + 1, 0x61);
    const {err, res} = await unary(diagnostics, 'Ping', {payload}, 30000);
    assert(err, `Ping(1 MiB + 1) succeeded (echoed ${res && res.payload ? res.payload.length : 0} bytes)`);
    assert(err.code === grpc.status.INVALID_ARGUMENT || err.code === grpc.status.RESOURCE_EXHAUSTED,
           `status ${codeName(err.code)} (${err.details}), want INVALID_ARGUMENT or RESOURCE_EXHAUSTED`);
    return `${codeName(err.code)}: "${err.details}"`;
  });

  await check('(e2) the server still serves after the oversized request', async () => {
    const {err, res} = await unary(diagnostics, 'Ping', {payload: Buffer.from('again')});
    if (err) throw new Error(`Ping failed: ${codeName(err.code)}: ${err.details}`);
    assert(Buffer.from(res.payload).toString() === 'again', 'payload differs');
  });

  // The clients stay connected (idle) during shutdown: an idle connection must not hold
  // the server up.
  await check('(f) SIGTERM makes the server exit with code 0 within 10 s', async () => {
    assert(serverExit === null, `server already exited: ${describeExit(serverExit)}`);
    server.kill('SIGTERM');
    const exit = await waitForExit(kShutdownTimeoutMs);
    assert(exit !== null, `still running ${kShutdownTimeoutMs / 1000} s after SIGTERM`);
    assert(exit.code === 0 && !exit.signal, `server ended with ${describeExit(exit)}, want exit code 0`);
  });

  for (const c of clients) c.close();
}

main().then(() => {
  const failed = results.filter((r) => !r.ok);
  if (failed.length > 0) {
    dumpServerLog();
    console.log(`${failed.length} of ${results.length} checks FAILED`);
    cleanUp();
    process.exit(1);
  }
  console.log(`all ${results.length} checks passed`);
  cleanUp();
  process.exit(0);
}, (err) => {
  console.log(`FAIL - ${err && err.message ? err.message : err}`);
  dumpServerLog();
  cleanUp();
  process.exit(1);
});
