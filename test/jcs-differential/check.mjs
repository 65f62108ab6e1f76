// test/jcs-differential/check.mjs: random documents for the differential
// check of idem_canonical against the npm package canonicalize (an
// independent RFC 8785 implementation).  run.sh drives it:
//
//   node check.mjs generate COUNT SEED DIR   writes DIR/docs.hex, DIR/expected.txt
//   node check.mjs compare DIR [FILE]        reads DIR/FILE (actual.txt), reports
//
// Every number has at most 15 significant digits and a magnitude between
// 1e-300 and 1e300, so that its nearest double (what RFC 8785 formats)
// prints as the same decimal that jsonb keeps exactly.  The JSON text of
// each document is written in a random style (whitespace, escapes, number
// notation) so that the parse side is exercised too.  Texts travel as hex,
// one document per line, so that no quoting can get in the way.
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import canonicalize from 'canonicalize';

// canonicalize calls String.prototype.isWellFormed (Node.js 20), which
// Debian 12's Node.js 18 lacks: a string is well formed when it holds no
// lone surrogate, which a regular expression with the u flag matches as a
// code point of its own.
if (typeof String.prototype.isWellFormed !== 'function') {
  Object.defineProperty(String.prototype, 'isWellFormed', {
    value: function isWellFormed() { return !/\p{Cs}/u.test(String(this)); },
    configurable: true,
    writable: true,
  });
}

// mulberry32: a small seeded generator, so that a failure can be replayed.
function makeRandom(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6D2B79F5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

let rnd = makeRandom(1);
const int = (lo, hi) => lo + Math.floor(rnd() * (hi - lo + 1));
const pick = (list) => list[Math.floor(rnd() * list.length)];
const chance = (p) => rnd() < p;

// Code points by class; no U+0000 (jsonb refuses it) and no lone surrogates.
const codePointClasses = [
  () => int(0x61, 0x7a),                        // a-z
  () => int(0x30, 0x39),                        // digits: "1", "10" keys
  () => int(0x20, 0x7e),                        // printable ASCII, '"' and '\' included
  () => int(0x01, 0x1f),                        // control characters
  () => pick([0x7f, 0x80, 0x9f, 0xa0, 0xe9, 0xf6, 0xff]),
  () => int(0x100, 0x7ff),                      // two-byte UTF-8
  () => int(0x800, 0xd7ff),                     // three bytes, below the surrogates
  () => int(0xe000, 0xffff),                    // private use and U+FFxx: sort after astral in UTF-16
  () => pick([0x2028, 0x2029, 0xfb33, 0xfeff, 0xfffd, 0xe000, 0xffff]),
  () => int(0x10000, 0x10ffff),                 // astral plane
  () => int(0x1f600, 0x1f64f),                  // emoji
];

function randomString(maxLength) {
  const n = int(0, maxLength);
  let s = '';
  for (let i = 0; i < n; i++) {
    s += String.fromCodePoint(pick(codePointClasses)());
  }
  return s;
}

// A key drawn from a small pool now and then, so that names share prefixes.
const keyPool = ['a', 'b', 'aa', 'ab', '1', '10', '2', 'é', '\u{1F602}', '\uE000',
  '\uFB33', 'x\u{1F602}', 'x\uE000', 'x', 'A', 'Z', '\u2028', '"', '\\', '\n'];
function randomKey() {
  if (chance(0.3)) return pick(keyPool) + (chance(0.5) ? randomString(2) : '');
  return randomString(8);
}

// A number of at most 15 significant digits: its digits and the decimal
// exponent of the first one.
function randomNumber() {
  if (chance(0.05)) return { digits: '0', exp: 0, negative: chance(0.5) };
  const k = chance(0.5) ? int(1, 4) : int(1, 15);
  let digits = String(int(1, 9));
  for (let i = 1; i < k; i++) digits += String(int(0, 9));
  let exp;
  switch (int(0, 3)) {
    case 0: exp = int(-8, 22); break;           // around the formatting edges
    case 1: exp = int(0, 15); break;            // everyday integers and amounts
    case 2: exp = int(-30, 30); break;
    default: exp = int(-300, 299); break;       // 1e-300 .. 9.99e299
  }
  return { digits, exp, negative: chance(0.3) };
}

// The number written in one of the many JSON spellings of its value.
function writeNumber({ digits, exp, negative }) {
  const sign = negative ? '-' : '';
  if (digits === '0') return sign + pick(['0', '0.0', '0e5', '0.000E-3']);
  const pad = '0'.repeat(int(0, 3));            // trailing zeros change nothing
  if (chance(0.5) && exp > -30 && exp < 30) {
    // plain notation
    const d = digits + pad;
    const point = exp + 1;                      // digits before the point
    if (point <= 0) return sign + '0.' + '0'.repeat(-point) + d;
    if (point >= d.length) return sign + d + '0'.repeat(point - d.length) + (chance(0.3) ? '.0' : '');
    return sign + d.slice(0, point) + '.' + d.slice(point);
  }
  // exponent notation, the point after a random digit
  const d = digits + pad;
  const before = int(1, d.length);
  const mantissa = d.slice(0, before) + (before < d.length ? '.' + d.slice(before) : '');
  const e = exp - (before - 1);
  return sign + mantissa + pick(['e', 'E']) + (e >= 0 ? pick(['', '+']) : '-') + Math.abs(e);
}

// The string written with a random choice of escapes.
function writeString(s) {
  let out = '"';
  for (const ch of s) {
    const cp = ch.codePointAt(0);
    const short = { 0x22: '\\"', 0x5c: '\\\\', 0x08: '\\b', 0x0c: '\\f', 0x0a: '\\n', 0x0d: '\\r', 0x09: '\\t' }[cp];
    const hex4 = (u) => '\\u' + (chance(0.5) ? u.toString(16).padStart(4, '0') : u.toString(16).toUpperCase().padStart(4, '0'));
    if (cp < 0x20 || cp === 0x22 || cp === 0x5c) {
      out += short && chance(0.7) ? short : hex4(cp);
    } else if (cp === 0x2f && chance(0.3)) {
      out += '\\/';
    } else if (chance(0.15)) {
      // escape it anyway; astral characters as a surrogate pair
      if (cp > 0xffff) {
        out += hex4(ch.charCodeAt(0)) + hex4(ch.charCodeAt(1));
      } else {
        out += hex4(cp);
      }
    } else {
      out += ch;
    }
  }
  return out + '"';
}

const ws = () => (chance(0.2) ? pick([' ', '  ', '\t', ' \t ']) : '');

// A random value, returned as its JSON text.
function randomValue(depth) {
  const r = rnd();
  if (depth < 6 && r < 0.2) {
    const n = int(0, 8);
    const keys = new Set();
    for (let i = 0; i < n; i++) keys.add(randomKey());
    const members = [...keys].map((k) => ws() + writeString(k) + ws() + ':' + ws() + randomValue(depth + 1) + ws());
    return '{' + members.join(',') + (n === 0 ? ws() : '') + '}';
  }
  if (depth < 6 && r < 0.35) {
    const n = int(0, 8);
    const items = [];
    for (let i = 0; i < n; i++) items.push(ws() + randomValue(depth + 1) + ws());
    return '[' + items.join(',') + ']';
  }
  if (r < 0.6) return writeNumber(randomNumber());
  if (r < 0.85) return writeString(randomString(12));
  return pick(['true', 'false', 'null']);
}

function generate(count, seed, dir) {
  rnd = makeRandom(seed);
  const docs = [];
  const expected = [];
  for (let i = 0; i < count; i++) {
    // mostly objects, as requests are; now and then a bare value
    let text;
    do {
      text = chance(0.9) ? randomValue(0) : randomValue(5);
    } while (i % 10 !== 0 && !text.startsWith('{') && !text.startsWith('['));
    const canonical = Buffer.from(canonicalize(JSON.parse(text)), 'utf8');
    docs.push(Buffer.from(text, 'utf8').toString('hex'));
    expected.push(canonical.toString('hex') + ' ' + createHash('sha256').update(canonical).digest('hex'));
  }
  writeFileSync(`${dir}/docs.hex`, docs.join('\n') + '\n');
  writeFileSync(`${dir}/expected.txt`, expected.join('\n') + '\n');
}

// Count what a document holds, for the report.
function walk(value, stats) {
  if (typeof value === 'number') {
    stats.numbers++;
  } else if (Array.isArray(value)) {
    value.forEach((v) => walk(v, stats));
  } else if (value !== null && typeof value === 'object') {
    for (const [k, v] of Object.entries(value)) {
      stats.keys++;
      if (/[\u{10000}-\u{10FFFF}]/u.test(k)) stats.astralKeys++;
      walk(v, stats);
    }
  }
}

function compare(dir, file = 'actual.txt') {
  const docs = readFileSync(`${dir}/docs.hex`, 'utf8').trimEnd().split('\n');
  const expected = readFileSync(`${dir}/expected.txt`, 'utf8').trimEnd().split('\n');
  const actual = readFileSync(`${dir}/${file}`, 'utf8').trimEnd().split('\n');
  let passed = 0;
  let failed = 0;
  const stats = { bytes: 0, keys: 0, astralKeys: 0, numbers: 0 };
  for (let i = 0; i < expected.length; i++) {
    const [expCanon, expHash] = expected[i].split(' ');
    const [id, actCanon, actHash] = (actual[i] ?? '').split('|');
    const canonical = Buffer.from(expCanon, 'hex').toString('utf8');
    stats.bytes += expCanon.length / 2;
    walk(JSON.parse(canonical), stats);
    if (Number(id) === i + 1 && actCanon === expCanon && actHash === expHash) {
      passed++;
      continue;
    }
    failed++;
    if (failed <= 5) {
      console.log(`document ${i + 1} differs`);
      console.log('  input:          ' + Buffer.from(docs[i], 'hex').toString('utf8'));
      console.log('  canonicalize:   ' + canonical);
      console.log('  idem_canonical: ' + Buffer.from(actCanon ?? '', 'hex').toString('utf8'));
      console.log('  fingerprints:   ' + expHash + ' / ' + actHash);
    }
  }
  if (actual.length !== expected.length) {
    console.log(`expected ${expected.length} results, got ${actual.length}`);
    failed++;
  }
  console.log(`documents: ${expected.length}, canonical bytes: ${stats.bytes}, numbers: ${stats.numbers}, ` +
    `member names: ${stats.keys} (${stats.astralKeys} with an astral-plane character)`);
  console.log(`differential: ${passed} passed, ${failed} failed`);
  process.exitCode = failed === 0 ? 0 : 1;
}

const [command, ...args] = process.argv.slice(2);
if (command === 'generate') {
  generate(Number(args[0]), Number(args[1]), args[2]);
} else if (command === 'compare') {
  compare(args[0], args[1]);
} else {
  console.error('usage: node check.mjs generate COUNT SEED DIR | compare DIR [FILE]');
  process.exit(2);
}
