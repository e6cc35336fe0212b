// The rest of a sandbox's life through sbx's E2B front, with the unmodified `e2b` SDK
// against a real local sbx-server: a PTY (create, sendInput, resize, its output), watchDir
// (events for files made, written and removed), and a second client that connects to the
// same sandbox by id and works in it.
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import {after, before, test} from 'node:test';
import {setTimeout as sleep} from 'node:timers/promises';

import {Sandbox} from 'e2b';

import {BOB, TestServer} from './harness.mjs';

// With the port proxy, and the E2B domain the SDK's getHost names (E2B_DOMAIN, harness.mjs).
const server = new TestServer({extraArgs: ['--proxy_listen=127.0.0.1:0', '--e2b_domain=sbx.localhost']});
let sbx;

before(async () => {
  await server.start();
  server.useFromE2b();
  sbx = await Sandbox.create('default', {timeoutMs: 300_000});
});

after(async () => {
  if (sbx) await sbx.kill().catch(() => {});
  await server.cleanUp();
});

async function until(what, cond, ms = 20_000) {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

test('pty: create, sendInput, resize, output', async () => {
  let output = '';
  const decoder = new TextDecoder();
  const pty = await sbx.pty.create({cols: 80, rows: 24, onData: (d) => { output += decoder.decode(d); }});
  assert.ok(pty.pid > 0);
  const enc = new TextEncoder();
  await sbx.pty.sendInput(pty.pid, enc.encode('stty size; echo "tty=$(test -t 0 && echo yes)"\n'));
  await until('the first size', () => /24 80/.test(output) && /tty=yes/.test(output));
  await sbx.pty.resize(pty.pid, {cols: 100, rows: 30});
  await sbx.pty.sendInput(pty.pid, enc.encode('stty size\n'));
  await until('the new size', () => /30 100/.test(output));
  await sbx.pty.sendInput(pty.pid, enc.encode('exit 7\n'));
  const result = await pty.wait().catch((e) => e);
  assert.equal(result.exitCode, 7);
});

test('watchDir reports files made, written and removed', async () => {
  await sbx.files.makeDir('/home/user/watched');
  const events = [];
  const handle = await sbx.files.watchDir('/home/user/watched', (ev) => events.push(ev));
  try {
    await sbx.files.write('/home/user/watched/new.txt', 'x');
    await until('a create of new.txt', () => events.some((e) => e.name === 'new.txt' && e.type === 'create'));
    await sbx.commands.run('echo more >> watched/new.txt');
    await until('a write of new.txt', () => events.some((e) => e.name === 'new.txt' && e.type === 'write'));
    await sbx.files.remove('/home/user/watched/new.txt');
    await until('a remove of new.txt', () => events.some((e) => e.name === 'new.txt' && e.type === 'remove'));
  } finally {
    await handle.stop();
  }
  await assert.rejects(sbx.files.watchDir('/home/user/not-there', () => {}), /not found|not_found|NotFound/i);
});

test('a second client connects to the sandbox by id', async () => {
  await sbx.files.write('/home/user/shared.txt', 'from the first client');
  const other = await Sandbox.connect(sbx.sandboxId);
  assert.equal(other.sandboxId, sbx.sandboxId);
  assert.equal(await other.files.read('/home/user/shared.txt'), 'from the first client');
  const run = await other.commands.run('cat shared.txt; echo; echo second >> shared.txt');
  assert.equal(run.stdout, 'from the first client\n');
  assert.equal(await sbx.files.read('/home/user/shared.txt'), 'from the first clientsecond\n');
  assert.equal((await other.getInfo()).state, 'running');
});

test('the server stops promptly and cleanly with an E2B process stream open', async (t) => {
  const own = new TestServer();
  await own.start();
  const opts = {apiKey: process.env.E2B_API_KEY, apiUrl: own.url, sandboxUrl: own.url};
  // The SDK reads the URLs from the environment at each call: point it at this server.
  const saved = {api: process.env.E2B_API_URL, sandbox: process.env.E2B_SANDBOX_URL};
  process.env.E2B_API_URL = own.url;
  process.env.E2B_SANDBOX_URL = own.url;
  try {
    const s = await Sandbox.create('default', {...opts, timeoutMs: 60_000});
    const h = await s.commands.run('sleep 100', {background: true});
    const t0 = Date.now();
    await own.stop();
    t.diagnostic(`stopped in ${Date.now() - t0} ms`);
    assert.equal(own.proc.exitCode, 0, own.log);
    await h.wait().catch(() => {});
  } finally {
    process.env.E2B_API_URL = saved.api;
    process.env.E2B_SANDBOX_URL = saved.sandbox;
    await own.cleanUp();
  }
});

// A web server for the port tests, run inside the sandbox on 127.0.0.1:8000 (python's
// standard library only): GET answers "hello <path>", POST the sha256 of its body, both
// with keep-alive; GET /ws with Upgrade: websocket echoes frames. Every request it sees is
// appended to requests.log (method, path, and whether credentials reached it).
const WEB_SERVER = String.raw`
import base64, hashlib, http.server, struct

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def log_message(self, *args):
        pass

    def record(self):
        creds = [h for h in ('X-Access-Token', 'X-Api-Key') if self.headers.get(h)]
        with open('requests.log', 'a') as f:
            f.write('%s %s %s\n' % (self.command, self.path, ','.join(creds) or '-'))

    def answer(self, body):
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.record()
        if self.path == '/ws' and self.headers.get('Upgrade', '').lower() == 'websocket':
            return self.websocket()
        self.answer(('hello %s\n' % self.path).encode())

    def do_POST(self):
        self.record()
        data = self.rfile.read(int(self.headers.get('Content-Length', '0')))
        self.answer(hashlib.sha256(data).hexdigest().encode())

    def websocket(self):
        key = self.headers['Sec-WebSocket-Key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11'
        self.send_response(101)
        self.send_header('Upgrade', 'websocket')
        self.send_header('Connection', 'Upgrade')
        self.send_header('Sec-WebSocket-Accept', base64.b64encode(hashlib.sha1(key.encode()).digest()).decode())
        self.end_headers()
        self.close_connection = True
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            op, n = head[0] & 0x0f, head[1] & 0x7f
            if n == 126:
                n = struct.unpack('>H', self.rfile.read(2))[0]
            elif n == 127:
                n = struct.unpack('>Q', self.rfile.read(8))[0]
            mask = self.rfile.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            if op == 8:
                self.wfile.write(b'\x88\x00')
                return
            size = bytes([n]) if n < 126 else b'\x7e' + struct.pack('>H', n)
            self.wfile.write(bytes([0x80 | op]) + size + data)

http.server.ThreadingHTTPServer(('127.0.0.1', 8000), H).serve_forever()
`;

// An HTTP request to the E2B listener by URL, whatever host name the URL has (getHost's
// PORT-ID.DOMAIN does not resolve here: the test resolves every name to 127.0.0.1).
function request(url, {method = 'GET', headers = {}, body, agent} = {}) {
  const lookup = (host, opts, cb) => (opts && opts.all ? cb(null, [{address: '127.0.0.1', family: 4}])
                                                       : cb(null, '127.0.0.1', 4));
  return new Promise((resolve, reject) => {
    const req = http.request(url, {method, headers, agent, lookup}, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { text += d; });
      res.on('end', () => resolve({status: res.statusCode, headers: res.headers, body: text,
                                   reused: req.reusedSocket}));
    });
    req.on('error', reject);
    req.end(body);
  });
}

// Raw bytes to the E2B listener: writes `parts` one after the other (each once the answer
// to the previous one, with a Content-Length, is whole), returns all it read until the
// server closed the connection or `ms` passed.
function rawExchange(parts, {ms = 5_000} = {}) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(server.e2bPort, '127.0.0.1');
    let got = '';
    let next = 0;
    const timer = setTimeout(() => { sock.destroy(); resolve({text: got, closed: false}); }, ms);
    const send = () => { if (next < parts.length) sock.write(parts[next++]); };
    sock.on('connect', send);
    sock.on('data', (d) => {
      got += d.toString('latin1');
      // The next part once the previous answer is whole (a Content-Length answer).
      const m = /Content-Length: (\d+)\r\n(?:.+\r\n)*\r\n/i.exec(got);
      if (m && got.length >= m.index + m[0].length + Number(m[1])) send();
    });
    sock.on('close', () => { clearTimeout(timer); resolve({text: got, closed: true}); });
    sock.on('error', (e) => { clearTimeout(timer); reject(e); });
  });
}

// A WebSocket client over a plain socket to the E2B listener: the Upgrade request with
// `headers`, then each message as a masked text frame, each echo read back.
function webSocketEcho(host, headers, messages) {
  return new Promise((resolve, reject) => {
    const key = crypto.randomBytes(16).toString('base64');
    const sock = net.connect(server.e2bPort, '127.0.0.1');
    const timer = setTimeout(() => { sock.destroy(); reject(new Error('the WebSocket echo timed out')); }, 20_000);
    let buf = Buffer.alloc(0);
    let head;
    const echoes = [];
    const frame = (text) => {
      const data = Buffer.from(text);
      const mask = crypto.randomBytes(4);
      const masked = Buffer.from(data.map((b, i) => b ^ mask[i % 4]));
      return Buffer.concat([Buffer.from([0x81, 0x80 | data.length]), mask, masked]);
    };
    sock.on('connect', () => {
      const lines = [`GET /ws HTTP/1.1`, `Host: ${host}`, 'Upgrade: websocket', 'Connection: Upgrade',
                     `Sec-WebSocket-Key: ${key}`, 'Sec-WebSocket-Version: 13',
                     ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`)];
      sock.write(`${lines.join('\r\n')}\r\n\r\n`);
    });
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      if (head === undefined) {
        const end = buf.indexOf('\r\n\r\n');
        if (end < 0) return;
        head = buf.subarray(0, end).toString('latin1');
        buf = buf.subarray(end + 4);
        if (!head.startsWith('HTTP/1.1 101')) {
          clearTimeout(timer);
          sock.destroy();
          return resolve({head, echoes});
        }
        const accept = crypto.createHash('sha1').update(`${key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`).digest('base64');
        assert.match(head, new RegExp(`Sec-WebSocket-Accept: ${accept.replace(/[+/]/g, '\\$&')}`, 'i'));
        sock.write(frame(messages[0]));
      }
      while (buf.length >= 2 && buf.length >= 2 + (buf[1] & 0x7f)) {
        const n = buf[1] & 0x7f;
        echoes.push(buf.subarray(2, 2 + n).toString());
        buf = buf.subarray(2 + n);
        if (echoes.length < messages.length) {
          sock.write(frame(messages[echoes.length]));
        } else {
          clearTimeout(timer);
          sock.end(Buffer.from([0x88, 0x80, 0, 0, 0, 0]));
          sock.destroy();
          return resolve({head, echoes});
        }
      }
    });
    sock.on('error', (e) => { clearTimeout(timer); reject(e); });
  });
}

test('ports: served in place by getHost and by the sandbox headers, keep-alive and WebSocket', async (t) => {
  await sbx.files.write('/home/user/web/server.py', WEB_SERVER);
  const web = await sbx.commands.run('cd web && exec python3 server.py', {background: true});
  try {
    // getHost(port), as an E2B program reaches a port: PORT-ID.DOMAIN at the E2B listener.
    const base = `http://${sbx.getHost(8000)}:${server.e2bPort}`;
    const token = {'X-Access-Token': sbx.envdAccessToken};
    const deadline = Date.now() + 20_000;
    let first;
    for (;;) {
      first = await request(`${base}/hello?x=1`, {headers: token});
      if (first.status === 200 || Date.now() > deadline) break;
      await sleep(100);
    }
    // Answered by the sandbox's server itself, not redirected.
    assert.equal(first.status, 200, first.body);
    assert.equal(first.body, 'hello /hello?x=1\n');

    // Keep-alive: several requests, a POST with a body among them, on one connection.
    const agent = new http.Agent({keepAlive: true, maxSockets: 1});
    try {
      const a = await request(`${base}/one`, {headers: token, agent});
      const payload = crypto.randomBytes(300_000);
      const b = await request(`${base}/upload`, {method: 'POST', headers: token, agent, body: payload});
      const c = await request(`${base}/two`, {headers: token, agent});
      assert.equal(a.body, 'hello /one\n');
      assert.equal(b.body, crypto.createHash('sha256').update(payload).digest('hex'));
      assert.equal(c.body, 'hello /two\n');
      assert.equal(c.reused, true, 'the third request went on the first one\'s connection');
    } finally {
      agent.destroy();
    }

    // The sandbox headers, with fetch (as E2B_SANDBOX_URL clients address a sandbox).
    const res = await fetch(`${server.url}/by-headers`,
                            {headers: {'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000', ...token}});
    assert.equal(res.redirected, false);
    assert.equal(res.status, 200);
    assert.equal(await res.text(), 'hello /by-headers\n');

    // The owner's API key is a credential too.
    const byKey = await request(`${base}/by-key`, {headers: {'X-API-Key': process.env.E2B_API_KEY}});
    assert.equal(byKey.status, 200, byKey.body);

    // A WebSocket through the E2B listener: the Upgrade, then frames both ways.
    const ws = await webSocketEcho(sbx.getHost(8000), token, ['ping', 'second message']);
    assert.match(ws.head, /^HTTP\/1\.1 101/, ws.head);
    assert.deepEqual(ws.echoes, ['ping', 'second message']);

    // The front's credentials never reach the sandbox.
    const log = await sbx.files.read('/home/user/web/requests.log');
    t.diagnostic(log);
    assert.match(log, /^GET \/by-key -$/m);
    assert.doesNotMatch(log, /X-Access-Token|X-Api-Key/);
  } finally {
    await sbx.commands.kill(web.pid);
  }
});

// Attacks on port traffic at the E2B listener: another tenant's key, no or another
// sandbox's access token, request smuggling. None may reach the sandbox's server.
test('ports: refused without the right to the sandbox, and smuggling refused', async () => {
  await sbx.files.write('/home/user/web/server.py', WEB_SERVER);
  await sbx.files.write('/home/user/web/requests.log', '');
  const web = await sbx.commands.run('cd web && exec python3 server.py', {background: true});
  const bobs = await Sandbox.create('default', {apiKey: BOB, timeoutMs: 60_000});
  try {
    const host = sbx.getHost(8000);
    const base = `http://${host}:${server.e2bPort}`;
    const token = {'X-Access-Token': sbx.envdAccessToken};
    const deadline = Date.now() + 20_000;
    while ((await request(`${base}/ready`, {headers: token})).status !== 200) {
      if (Date.now() > deadline) throw new Error('the web server never answered');
      await sleep(100);
    }

    // Each on a connection of its own (agent: false).
    // Tenant B's API key on A's sandbox port: 404, as for a sandbox that does not exist.
    const byBob = await request(`${base}/attack-bob-key`, {headers: {'X-API-Key': BOB}, agent: false});
    assert.equal(byBob.status, 404, byBob.body);
    // No credential, B's sandbox's access token, a forged one, a bad key: 401.
    for (const h of [{}, {'X-Access-Token': bobs.envdAccessToken},
                     {'X-Access-Token': `alice~${'0'.repeat(64)}`}, {'X-API-Key': 'not-a-key'}]) {
      const res = await request(`${base}/attack-token`, {headers: h, agent: false});
      assert.equal(res.status, 401, `${JSON.stringify(h)}: ${res.body}`);
    }
    // By the headers too.
    const byHeaders = await request(`${server.url}/attack-bob-key`,
                                    {headers: {'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000',
                                               'X-API-Key': BOB}, agent: false});
    assert.equal(byHeaders.status, 404, byHeaders.body);

    // A kept-alive connection opened with A's token does not carry B's requests (a shared
    // client pool): B's key, or no credential, on it closes it unanswered by the sandbox.
    for (const h of [{'X-API-Key': BOB}, {}]) {
      const agent = new http.Agent({keepAlive: true, maxSockets: 1});
      try {
        const ok = await request(`${base}/benign`, {headers: token, agent});
        assert.equal(ok.status, 200);
        await assert.rejects(request(`${base}/attack-reused`, {headers: h, agent}),
                             /socket hang up|ECONNRESET/);
      } finally {
        agent.destroy();
      }
    }

    // Smuggling: Content-Length with Transfer-Encoding, first on a fresh connection, then
    // as the second request of a connection already handed to the proxy. The body hides a
    // request a server reading Content-Length would not see and one reading chunked would.
    const smuggle = `POST /attack-smuggle HTTP/1.1\r\nHost: ${host}\r\nX-Access-Token: ${sbx.envdAccessToken}\r\n` +
                    'Content-Length: 44\r\nTransfer-Encoding: chunked\r\n\r\n' +
                    `0\r\n\r\nGET /attack-smuggled HTTP/1.1\r\nHost: x\r\n\r\n`;
    const fresh = await rawExchange([smuggle]);
    assert.match(fresh.text, /^HTTP\/1\.1 400/, fresh.text);
    const benign = `GET /benign HTTP/1.1\r\nHost: ${host}\r\nX-Access-Token: ${sbx.envdAccessToken}\r\n\r\n`;
    const second = await rawExchange([benign, smuggle]);
    // The proxy answers a refusal on a connection already joined to the sandbox by closing
    // it (bytes of the sandbox may be on their way): no second answer of the sandbox.
    const statuses = [...second.text.matchAll(/HTTP\/1\.1 (\d{3})/g)].map((m) => m[1]);
    assert.equal(statuses[0], '200', second.text);
    assert.match(second.text, /hello \/benign\n/);
    assert.ok(statuses.slice(1).every((code) => code === '400'), second.text);
    assert.ok(second.closed, 'the connection is closed after the refusal');

    const log = await sbx.files.read('/home/user/web/requests.log');
    assert.match(log, /^GET \/benign /m);
    assert.doesNotMatch(log, /attack/, log);
  } finally {
    await bobs.kill().catch(() => {});
    await sbx.commands.kill(web.pid);
  }
});

// A connection handed to the proxy counts against the proxy's limits and its idle timeout
// (a server of its own: one proxied connection per sandbox, 1 s idle).
test('ports: the proxy\'s connection limit and idle timeout apply to handed connections', async () => {
  const own = new TestServer({extraArgs: ['--proxy_listen=127.0.0.1:0', '--e2b_domain=sbx.localhost',
                                          '--proxy_max_connections_per_sandbox=1', '--proxy_idle_timeout_s=1']});
  await own.start();
  // The SDK reads its URLs from the environment at each call: point it at this server.
  const saved = {api: process.env.E2B_API_URL, sandbox: process.env.E2B_SANDBOX_URL};
  process.env.E2B_API_URL = own.url;
  process.env.E2B_SANDBOX_URL = own.url;
  try {
    const s = await Sandbox.create('default', {timeoutMs: 60_000});
    await s.files.write('/home/user/web/server.py', WEB_SERVER);
    await s.commands.run('cd web && exec python3 server.py', {background: true});
    const get = (p) => new Promise((resolve, reject) => {
      const req = http.request({host: '127.0.0.1', port: own.e2bPort, path: p, agent: false,
                                headers: {'Host': s.getHost(8000), 'X-Access-Token': s.envdAccessToken}}, (res) => {
        let body = '';
        res.on('data', (d) => { body += d; });
        res.on('end', () => resolve({status: res.statusCode, body}));
      });
      req.on('error', reject);
      req.end();
    });
    const deadline = Date.now() + 20_000;
    while ((await get('/ready')).status !== 200) {  // 502 until the web server listens
      if (Date.now() > deadline) throw new Error('the web server never answered');
      await sleep(100);
    }
    // One kept-alive connection, answered, then held open and idle (retried while the
    // connection of /ready may still count: its close reaches the proxy asynchronously).
    let held;
    let heldText;
    let heldClosed;
    for (;;) {
      held = net.connect(own.e2bPort, '127.0.0.1');
      heldText = '';
      heldClosed = new Promise((resolve) => held.on('close', resolve));
      held.on('data', (d) => { heldText += d; });
      held.on('error', () => {});
      held.write(`GET /held HTTP/1.1\r\nHost: ${s.getHost(8000)}\r\nX-Access-Token: ${s.envdAccessToken}\r\n\r\n`);
      await until('an answer on the held connection', () => /hello \/held|\r\n\r\n[\s\S]*\n$/.test(heldText));
      if (!/^HTTP\/1\.1 429/.test(heldText) || Date.now() > deadline) break;
      held.destroy();
      await sleep(50);
    }
    assert.match(heldText, /^HTTP\/1\.1 200[\s\S]*hello \/held/);
    // A second connection to the same sandbox is over the limit: 429, named.
    const over = await get('/second');
    assert.equal(over.status, 429, over.body);
    assert.match(over.body, /proxy_max_connections_per_sandbox/);
    // The held connection is closed once idle for the idle timeout.
    let closed = false;
    heldClosed.then(() => { closed = true; });
    await until('the idle connection to be closed', () => closed, 20_000);
    await s.kill();
  } finally {
    process.env.E2B_API_URL = saved.api;
    process.env.E2B_SANDBOX_URL = saved.sandbox;
    await own.cleanUp();
  }
});
