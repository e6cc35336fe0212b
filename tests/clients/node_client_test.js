#!/usr/bin/env node
// Independent Node.js client test for sbx-server.
//
// Starts the server binary itself on 127.0.0.1:0 (cwd: a temp dir), talks to it only
// through the public sbx.v1 protos (loaded with @grpc/proto-loader, no generated code)
// and the standard grpc.health.v1 / grpc.reflection.v1alpha services, goes through the
// user flow in a real sandbox (claim one from the pool "default" with a late-bound
// config, Exec in it: output, stderr, exit code, stdin; WriteFile / ReadFile / ListFiles;
// bad input; Release), then stops the server with SIGTERM.
//
// Usage: node node_client_test.js <path/to/sbx-server> <proto dir> [extra server flags...]
//   or:  SBX_SERVER=... SBX_PROTO_DIR=... [SBX_SERVER_FLAGS='...'] node node_client_test.js
// tests/clients/CMakeLists.txt passes --config=scripts/example-config.yaml (the pool
// "default") and relative --data_dir / --sandbox_root, which land in the temp dir.
// Exit status 0 when every check passed, 1 otherwise. The server, and every process
// whose command line names the temp dir (local sandboxes, which run in their own
// sessions), are killed at the end and on any failure, including an uncaught error or an
// interrupt of this script.

'use strict';

const childProcess = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');

const kNodeModules = path.join(__dirname, 'node_modules');
const kPortFileTimeoutMs = 20000;
const kShutdownTimeoutMs = 10000;
const kCallDeadlineMs = 10000;
// A first sandbox of a fresh pool: bubblewrap + sbx-sandboxd start, on a busy machine.
const kWarmTimeoutMs = 60000;
const kClaimWaitS = 30;
const kExecDeadlineMs = 30000;
const kMiB = 1024 * 1024;
const kKiB = 1024;
const kPool = 'default';  // declared by scripts/example-config.yaml

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

// Pids of live processes (not this one) whose command line names a path below `dir`.
function processesNaming(dir) {
  const pids = [];
  const want = Buffer.from(dir.endsWith('/') ? dir : `${dir}/`);
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    let cmdline;
    try {
      cmdline = fs.readFileSync(`/proc/${entry}/cmdline`);
    } catch (e) {
      continue;  // Gone meanwhile, or not ours to read.
    }
    if (cmdline.includes(want)) pids.push(Number(entry));
  }
  return pids;
}

function describeProcess(pid) {
  try {
    return `${pid}: ${fs.readFileSync(`/proc/${pid}/cmdline`).toString().replace(/\0/g, ' ')}`;
  } catch (e) {
    return `${pid}: (gone)`;
  }
}

// SIGKILLs every process whose command line names `dir`: local sandboxes run in their own
// sessions, so killing the server's process group does not reach them.
function killProcessesNaming(dir) {
  for (let round = 0; round < 10; ++round) {  // A process may fork while we kill: again.
    const pids = processesNaming(dir);
    if (pids.length === 0) return;
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch (e) {
        // Already gone.
      }
    }
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 50);  // 50 ms
  }
}

function cleanUp() {
  killServer();
  if (tmpDir) {
    killProcessesNaming(tmpDir);
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
  // Short and under /tmp: the sandboxes' unix sockets live below it (< 107 bytes). Real
  // path, as the server makes its folders absolute from its cwd; the clean-up finds the
  // sandboxes by this path in their command lines.
  tmpDir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), 'sbx-node-client-')));
  const portFile = path.join(tmpDir, 'port');
  const args = ['--listen=127.0.0.1:0', '--metrics_listen=127.0.0.1:0', `--port_file=${portFile}`,
    ...extraServerFlags];
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

// One SandboxService.Exec call: sends `start`, then the stdin chunks and close_stdin,
// and keeps the client side open until the server's `exit` arrived (so that the
// process's stdin is closed by close_stdin, not by a half-close). Resolves with
// {err, responses}: err is the call's non-OK status ({code, details}) or null.
function runExec(client, start, {stdinChunks = [], closeStdin = false, ms = kExecDeadlineMs} = {}) {
  return new Promise((resolve) => {
    const responses = [];
    const call = client.Exec({deadline: deadline(ms)});
    let status = null;
    let ended = false;
    const maybeDone = () => {
      if (status === null) return;
      if (status.code !== grpc.status.OK) {
        resolve({err: {code: status.code, details: status.details}, responses});
      } else if (ended) {
        resolve({err: null, responses});
      }
    };
    call.on('data', (msg) => {
      responses.push(msg);
      if (msg.kind === 'exit') call.end();
    });
    call.on('end', () => { ended = true; maybeDone(); });
    call.on('error', () => {});  // reported through 'status'
    call.on('status', (st) => { status = st; maybeDone(); });
    call.write({start});
    for (const chunk of stdinChunks) call.write({stdin_chunk: chunk});
    if (closeStdin) call.write({close_stdin: {}});
  });
}

// Checks the order of Exec messages (started first, exit last and once) and the chunk
// sizes; returns {started, stdout, stderr, exit} (stdout and stderr as Buffers).
function splitExec(responses) {
  const kinds = responses.map((r) => r.kind);
  assert(kinds.length > 0, 'Exec ended OK without any message');
  assert(kinds[0] === 'started', `first Exec message is ${kinds[0]}: ${kinds.join(',')}`);
  assert(kinds[kinds.length - 1] === 'exit', `last Exec message is ${kinds[kinds.length - 1]}`);
  assert(kinds.filter((k) => k === 'started').length === 1, `messages: ${kinds.join(',')}`);
  assert(kinds.filter((k) => k === 'exit').length === 1, `messages: ${kinds.join(',')}`);
  const out = [];
  const err = [];
  for (const r of responses.slice(1, -1)) {
    assert(r.kind === 'stdout_chunk' || r.kind === 'stderr_chunk', `unexpected ${r.kind}`);
    const chunk = Buffer.from(r[r.kind]);
    assert(chunk.length <= 64 * kKiB, `${r.kind} of ${chunk.length} bytes`);
    (r.kind === 'stdout_chunk' ? out : err).push(chunk);
  }
  return {started: responses[0].started, stdout: Buffer.concat(out), stderr: Buffer.concat(err),
          exit: responses[responses.length - 1].exit};
}

function exitCode(exit) {
  assert(exit.status === 'exit_code', `exit has no exit_code: ${JSON.stringify(exit)}`);
  return exit.exit_code;
}

function showBytes(buf) {
  return JSON.stringify(buf.toString('latin1'));
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
  SandboxService: ['Exec', 'WriteFile', 'ReadFile', 'ListFiles', 'Suspend', 'Resume',
                   'StartProcess', 'ConnectProcess', 'ListProcesses', 'SendProcessInput',
                   'CloseProcessInput', 'SignalProcess', 'ResizeProcess', 'WaitProcess',
                   'UploadFile', 'DownloadFile', 'UploadTar', 'DownloadTar', 'Stat', 'MakeDir',
                   'Move', 'Remove', 'WatchDir', 'GetPortUrl'],
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
  const claims = new sbx.ClaimService(target, creds);
  const admin = new sbx.AdminService(target, creds);
  const clients = [healthClient, reflectionClient, diagnostics, sandboxes, claims, admin];

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

  // The user flow in a real sandbox of the pool "default" (scripts/example-config.yaml):
  // (d1) claims; (d2)..(d5) use the claim; (d6) releases it.
  const kEnvName = 'SBX_NODE_CLIENT_GREETING';
  const kEnvValue = 'hello from node, caf\u00e9 $HOME \'quoted\'';
  const kConfigPath = 'sbx-node/config.txt';
  const kConfigContent = Buffer.from('late-bound file\nsecond line \u2713\n', 'utf8');
  let claimId = null;
  const requireClaim = () => {
    if (!claimId) throw new Error('no claim: (d1) failed');
    return claimId;
  };

  await check('(d1) ClaimService.Claim from a warm pool with a late-bound config', async () => {
    // The pool fills in the background; wait (bounded) for a warm sandbox so that a
    // runtime failure is reported with the pool's last_error, not as a claim timeout.
    const warmBy = Date.now() + kWarmTimeoutMs;
    for (;;) {
      const {err, res} = await unary(admin, 'GetPool', {name: kPool});
      if (err) throw new Error(`GetPool failed: ${codeName(err.code)}: ${err.details}`);
      const status = res.pool.status || {};
      if (status.warm >= 1) break;
      if (Date.now() > warmBy) {
        throw new Error(`pool "${kPool}" has no warm sandbox after ${kWarmTimeoutMs / 1000} s: ` +
                        `status ${JSON.stringify(status)}`);
      }
      await sleep(200);
    }
    const id = `node-client-${process.pid}-${Date.now()}`;
    const {err, res} = await unary(claims, 'Claim', {
      claim_id: id,
      pool: kPool,
      empty_pool_policy: 'EMPTY_POOL_POLICY_WAIT',
      wait_timeout: {seconds: kClaimWaitS, nanos: 0},
      labels: {client: 'node'},
      config: {
        env: {[kEnvName]: kEnvValue},
        files: [{path: kConfigPath, content: kConfigContent, mode: 0o640}],
      },
    }, (kClaimWaitS + 5) * 1000);
    if (err) throw new Error(`Claim failed: ${codeName(err.code)}: ${err.details}`);
    const claim = res.claim;
    assert(!res.replayed, 'replayed is true for a new claim');
    assert(claim.claim_id === id, `claim_id ${claim.claim_id}, want ${id}`);
    assert(claim.pool === kPool, `pool ${claim.pool}`);
    assert(claim.state === 'CLAIM_STATE_ACTIVE', `state ${claim.state}`);
    assert(claim.sandbox && claim.sandbox.id, 'claim.sandbox.id is empty');
    assert(claim.labels.client === 'node', `labels ${JSON.stringify(claim.labels)}`);
    claimId = id;
    return `${id}: sandbox ${claim.sandbox.id}, ${claim.launch_type}`;
  });

  await check('(d2) Exec prints the late-bound env var and file, writes stderr, exits 7',
              async () => {
    const script = `printf "%s\\n" "$${kEnvName}"; cat ${kConfigPath}; ` +
                   'echo "to stderr" >&2; exit 7';
    const {err, responses} =
        await runExec(sandboxes, {claim_id: requireClaim(), argv: ['sh', '-c', script]});
    if (err) throw new Error(`Exec failed: ${codeName(err.code)}: ${err.details}`);
    const {started, stdout, stderr, exit} = splitExec(responses);
    assert(started.pid > 0, `started.pid ${started.pid}`);
    const want = Buffer.concat([Buffer.from(`${kEnvValue}\n`, 'utf8'), kConfigContent]);
    assert(stdout.equals(want), `stdout ${showBytes(stdout)}, want ${showBytes(want)}`);
    assert(stderr.equals(Buffer.from('to stderr\n')), `stderr ${showBytes(stderr)}`);
    assert(exitCode(exit) === 7, `exit_code ${exit.exit_code}, want 7`);
    assert(!exit.timed_out && !exit.truncated, `exit ${JSON.stringify(exit)}`);
    assert(Number(exit.stdout_bytes) === stdout.length, `stdout_bytes ${exit.stdout_bytes}`);
    assert(Number(exit.stderr_bytes) === stderr.length, `stderr_bytes ${exit.stderr_bytes}`);
    return `pid ${started.pid}, ${responses.length} messages`;
  });

  await check('(d3) Exec cat with stdin chunks and close_stdin echoes the input', async () => {
    const chunks = [Buffer.from('first line\n'), Buffer.from([...Array(256).keys()]),
                    Buffer.alloc(200 * kKiB, 0x7a), Buffer.from('\nlast\n')];
    const want = Buffer.concat(chunks);
    const {err, responses} = await runExec(
        sandboxes, {claim_id: requireClaim(), argv: ['cat'], attach_stdin: true},
        {stdinChunks: chunks, closeStdin: true});
    if (err) throw new Error(`Exec failed: ${codeName(err.code)}: ${err.details}`);
    const {stdout, stderr, exit} = splitExec(responses);
    assert(stdout.length === want.length, `stdout has ${stdout.length} bytes, want ${want.length}`);
    assert(stdout.equals(want), 'stdout differs from stdin');
    assert(stderr.length === 0, `stderr ${showBytes(stderr)}`);
    assert(exitCode(exit) === 0, `exit_code ${exit.exit_code}, want 0`);
    assert(Number(exit.stdout_bytes) === want.length, `stdout_bytes ${exit.stdout_bytes}`);
    return `${want.length} bytes in ${responses.length - 2} chunks`;
  });

  await check('(d4) WriteFile, ReadFile (whole and range) and ListFiles', async () => {
    const id = requireClaim();
    const content = Buffer.concat([...Array(12)].map(() => Buffer.from([...Array(256).keys()]))
                                      .concat([Buffer.from('end')]));
    let r = await unary(sandboxes, 'WriteFile', {claim_id: id, path: 'out/data.bin', content,
                                                 mode: 0o600, create_parents: true});
    if (r.err) throw new Error(`WriteFile failed: ${codeName(r.err.code)}: ${r.err.details}`);
    assert(Number(r.res.size) === content.length, `WriteFile size ${r.res.size}`);

    r = await unary(sandboxes, 'ReadFile', {claim_id: id, path: 'out/data.bin'});
    if (r.err) throw new Error(`ReadFile failed: ${codeName(r.err.code)}: ${r.err.details}`);
    assert(Buffer.from(r.res.content).equals(content), 'ReadFile content differs');
    assert(Number(r.res.size) === content.length, `ReadFile size ${r.res.size}`);
    assert(r.res.eof === true, 'ReadFile eof is false');
    assert((r.res.mode & 0o7777) === 0o600, `mode ${r.res.mode.toString(8)}, want 600`);

    r = await unary(sandboxes, 'ReadFile', {claim_id: id, path: 'out/data.bin', offset: 10,
                                            limit: 20});
    if (r.err) throw new Error(`ReadFile range failed: ${codeName(r.err.code)}: ${r.err.details}`);
    assert(Buffer.from(r.res.content).equals(content.subarray(10, 30)), 'range content differs');
    assert(r.res.eof === false, 'range read says eof');

    r = await unary(sandboxes, 'ReadFile', {claim_id: id, path: kConfigPath});
    if (r.err) throw new Error(`ReadFile config failed: ${codeName(r.err.code)}: ${r.err.details}`);
    assert(Buffer.from(r.res.content).equals(kConfigContent), 'late-bound file content differs');
    assert((r.res.mode & 0o7777) === 0o640, `late-bound file mode ${r.res.mode.toString(8)}`);

    // A command sees what WriteFile wrote.
    const ex = await runExec(sandboxes,
                             {claim_id: id, argv: ['sh', '-c', 'wc -c < out/data.bin']});
    if (ex.err) throw new Error(`Exec failed: ${codeName(ex.err.code)}: ${ex.err.details}`);
    const wc = splitExec(ex.responses);
    assert(exitCode(wc.exit) === 0, `wc exit_code ${wc.exit.exit_code}`);
    assert(wc.stdout.toString().trim() === String(content.length),
           `wc -c says ${showBytes(wc.stdout)}`);

    r = await unary(sandboxes, 'ListFiles', {claim_id: id, path: 'out'});
    if (r.err) throw new Error(`ListFiles failed: ${codeName(r.err.code)}: ${r.err.details}`);
    const names = r.res.files.map((f) => f.path);
    assert(JSON.stringify(names) === '["out/data.bin"]', `ListFiles out: ${names.join(', ')}`);
    const entry = r.res.files[0];
    assert(entry.type === 'FILE_TYPE_REGULAR', `type ${entry.type}`);
    assert(Number(entry.size) === content.length, `size ${entry.size}`);
    assert((entry.mode & 0o7777) === 0o600, `mode ${entry.mode.toString(8)}`);
    assert(r.res.next_page_token === '', 'next_page_token set on a one-entry listing');

    const all = new Map();
    const order = [];
    let token = '';
    for (let page = 0; page < 100; ++page) {  // bounded paging
      r = await unary(sandboxes, 'ListFiles', {claim_id: id, recursive: true, page_token: token});
      if (r.err) throw new Error(`ListFiles recursive failed: ${codeName(r.err.code)}: ${r.err.details}`);
      for (const f of r.res.files) {
        all.set(f.path, f.type);
        order.push(f.path);
      }
      token = r.res.next_page_token;
      if (!token) break;
    }
    assert(JSON.stringify(order) === JSON.stringify([...order].sort()),
           `recursive listing not ordered by path: ${order.join(', ')}`);
    for (const [p, type] of [['out', 'FILE_TYPE_DIRECTORY'], ['out/data.bin', 'FILE_TYPE_REGULAR'],
                             ['sbx-node', 'FILE_TYPE_DIRECTORY'], [kConfigPath, 'FILE_TYPE_REGULAR']]) {
      assert(all.get(p) === type, `recursive listing: ${p} is ${all.get(p)}, want ${type}; ` +
                                  `got ${order.join(', ')}`);
    }
    return `${order.length} entries in the workspace`;
  });

  await check('(d5) Exec with empty argv and ReadFile with ".." are INVALID_ARGUMENT', async () => {
    const id = requireClaim();
    const ex = await runExec(sandboxes, {claim_id: id, argv: []});
    assert(ex.err, `Exec with empty argv succeeded (${ex.responses.length} messages)`);
    assert(ex.err.code === grpc.status.INVALID_ARGUMENT,
           `Exec: ${codeName(ex.err.code)} (${ex.err.details}), want INVALID_ARGUMENT`);
    assert(/argv/.test(ex.err.details || ''), `message does not name argv: "${ex.err.details}"`);
    const details = [`"${ex.err.details}"`];
    for (const p of ['../etc/passwd', 'out/../out/data.bin']) {
      const {err} = await unary(sandboxes, 'ReadFile', {claim_id: id, path: p});
      assert(err, `ReadFile "${p}" succeeded`);
      assert(err.code === grpc.status.INVALID_ARGUMENT,
             `ReadFile "${p}": ${codeName(err.code)} (${err.details}), want INVALID_ARGUMENT`);
      assert((err.details || '').trim().length > 0, `ReadFile "${p}": status message is empty`);
      details.push(`"${err.details}"`);
    }
    return details.join('; ');
  });

  await check('(d6) Release, then Exec on the released claim is FAILED_PRECONDITION', async () => {
    const id = requireClaim();
    const {err, res} = await unary(claims, 'Release', {claim_id: id});
    if (err) throw new Error(`Release failed: ${codeName(err.code)}: ${err.details}`);
    assert(res.claim.state === 'CLAIM_STATE_RELEASED', `state ${res.claim.state}`);
    const ex = await runExec(sandboxes, {claim_id: id, argv: ['true']});
    assert(ex.err, `Exec on a released claim succeeded (${ex.responses.length} messages)`);
    assert(ex.err.code === grpc.status.FAILED_PRECONDITION,
           `Exec: ${codeName(ex.err.code)} (${ex.err.details}), want FAILED_PRECONDITION`);
    assert((ex.err.details || '').trim().length > 0, 'status message is empty');
    const rf = await unary(sandboxes, 'ReadFile', {claim_id: id, path: kConfigPath});
    assert(rf.err && rf.err.code === grpc.status.FAILED_PRECONDITION,
           `ReadFile on a released claim: ${rf.err ? `${codeName(rf.err.code)} (${rf.err.details})` : 'OK'}`);
    return `"${ex.err.details}"`;
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

  if (extraServerFlags.includes('--delete_sandboxes_on_exit')) {
    await check('(f2) no sandbox is left running after the server exited', async () => {
      // The server kills its sandboxes before exiting; a moment's grace for the kernel.
      const by = Date.now() + 5000;
      while (processesNaming(tmpDir).length > 0 && Date.now() < by) await sleep(50);
      const left = processesNaming(tmpDir);
      assert(left.length === 0, `processes left running: ${left.map(describeProcess).join('; ')}`);
    });
  }

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
