// Builds the package: copies the sbx.v1 protos from the repository's proto/ into
// dist/proto (the client loads them from there at run time, so an installed package
// needs nothing outside itself), then compiles src/ with tsc into dist/.
// With --tests it also compiles test/ and examples/ into dist-test/ (checked against
// the declarations the package exports).
import {execFileSync} from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import {fileURLToPath} from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const protoSrc = path.resolve(root, '../../proto/sbx/v1');
const protoDst = path.join(root, 'dist/proto/sbx/v1');
const tsc = path.join(root, 'node_modules/typescript/bin/tsc');

if (!fs.existsSync(tsc)) {
  console.error(`build: ${tsc} is missing: run \`npm ci\` in ${root} (scripts/install-deps does it)`);
  process.exit(1);
}
if (fs.existsSync(protoSrc)) {
  fs.rmSync(protoDst, {recursive: true, force: true});
  fs.mkdirSync(protoDst, {recursive: true});
  for (const f of fs.readdirSync(protoSrc).filter((f) => f.endsWith('.proto'))) {
    fs.copyFileSync(path.join(protoSrc, f), path.join(protoDst, f));
  }
} else if (!fs.existsSync(protoDst)) {
  console.error(`build: neither ${protoSrc} nor ${protoDst} exists`);
  process.exit(1);
}
const run = (project) => {
  try {
    execFileSync(process.execPath, [tsc, '-p', path.join(root, project)], {stdio: 'inherit'});
  } catch (e) {
    console.error(`build: tsc -p ${project} failed`);
    process.exit(1);
  }
};
run('tsconfig.json');
if (process.argv.includes('--tests')) run('tsconfig.test.json');
