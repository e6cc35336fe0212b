// Node 20 releases before 20.4 lack Symbol.asyncDispose / Symbol.dispose, which
// `await using` and the handles' dispose methods need. Imported first by every module
// that defines a dispose method.
const sym = Symbol as unknown as {asyncDispose?: symbol; dispose?: symbol};
sym.asyncDispose ??= Symbol.for('Symbol.asyncDispose');
sym.dispose ??= Symbol.for('Symbol.dispose');
export {};
