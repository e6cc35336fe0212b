// Builds sbx-mcp: compiles src/ with tsc into dist/ and makes dist/cli.js executable.
// With --tests it also compiles test/ into dist-test/. Needs node_modules (`npm ci`,
// which scripts/install-deps runs after the one of ../typescript, whose dist/ this uses).
import {execFileSync} from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import {fileURLToPath} from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const tsc = path.join(root, 'node_modules/typescript/bin/tsc');
const sdk = path.join(root, 'node_modules/@sbx/client/dist/index.d.ts');

if (!fs.existsSync(tsc)) {
  console.error(`build: ${tsc} is missing: run \`npm ci\` in ${root} (scripts/install-deps does it)`);
  process.exit(1);
}
if (!fs.existsSync(sdk)) {
  console.error(`build: ${sdk} is missing: build the SDK first (\`npm ci\` in clients/typescript; scripts/install-deps does it)`);
  process.exit(1);
}
const run = (project) => {
  try {
    execFileSync(process.execPath, [tsc, '-p', path.join(root, project)], {stdio: 'inherit'});
  } catch {
    console.error(`build: tsc -p ${project} failed`);
    process.exit(1);
  }
};
run('tsconfig.json');
fs.chmodSync(path.join(root, 'dist/cli.js'), 0o755);
if (process.argv.includes('--tests')) run('tsconfig.test.json');
