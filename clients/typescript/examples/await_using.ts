// The TypeScript form of the quickstart: `using` closes the client and `await using`
// releases the sandbox when the block ends, also when it throws.
// Built by `node scripts/build.mjs --tests` into dist-test/examples/await_using.js (run
// with node); sdk.typescript.local runs it.
import {Client} from '@sbx/client';

async function main(): Promise<void> {
  using client = new Client();  // $SBX_SERVER (default 127.0.0.1:50051), $SBX_TOKEN
  await using sandbox = await client.claim('default', {ttl: '10m', labels: {example: 'await-using'}});
  const {stdout, exitCode} = await sandbox.exec(['sh', '-c', 'echo $((6 * 7))']);
  console.log(`${stdout.trim()} (exit ${exitCode}) in ${sandbox.sandboxId} of claim ${sandbox.claimId}`);
}

await main();
