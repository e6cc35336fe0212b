// Quickstart: claim a warm sandbox, run a command and move a file in it, release it.
// Against `scripts/run` (pool "default"):  node clients/typescript/examples/quickstart.mjs
import {Client, PoolExhausted} from '@sbx/client';

const client = new Client();  // $SBX_SERVER (default 127.0.0.1:50051), $SBX_TOKEN
try {
  const sandbox = await client.claim('default', {ttl: '10m', env: {GREETING: 'hello'}});
  try {
    await sandbox.files.write('main.sh', 'echo "$GREETING from the sandbox $(hostname)"\n');
    const r = await sandbox.exec('sh main.sh');
    console.log(r.stdout.trim(), `(exit ${r.exitCode})`);
    console.log(await sandbox.files.list());
  } finally {
    const claim = await sandbox.release();
    console.log(`claim ${claim.claimId} ${claim.state}`);
  }
} catch (e) {
  if (e instanceof PoolExhausted) console.error(`pool empty; retry in ${e.retryAfterMs} ms`);
  throw e;
} finally {
  client.close();
}
