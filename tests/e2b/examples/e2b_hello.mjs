// An E2B program, unchanged: only its environment points it at sbx (docs/e2b.md).
import {Sandbox} from 'e2b';

const sandbox = await Sandbox.create('default', {metadata: {job: 'hello'}, envs: {GREETING: 'hi'}});
const run = await sandbox.commands.run('echo "$GREETING from $(uname -s)"; id -u');
await sandbox.files.write('/home/user/hello.txt', run.stdout);
console.log(await sandbox.files.read('/home/user/hello.txt'));
console.log((await Sandbox.list({query: {metadata: {job: 'hello'}}}).nextItems()).map((s) => s.sandboxId));
await sandbox.kill();
