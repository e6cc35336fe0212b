// Child of tls.test.mjs: an E2B flow against the URLs in its environment (HTTPS, with the
// test's CA in NODE_EXTRA_CA_CERTS, which node reads only at start). Prints one JSON line.
import {Sandbox} from 'e2b';

const sbx = await Sandbox.create('default', {timeoutMs: 60_000});
try {
  const run = await sbx.commands.run('echo over-tls');
  await sbx.files.write('/home/user/t.txt', 'tls file');
  const read = await sbx.files.read('/home/user/t.txt');
  console.log(JSON.stringify({stdout: run.stdout, read}));
} finally {
  await sbx.kill();
}
