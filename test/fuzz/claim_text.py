#!/usr/bin/python3
"""Differential fuzzer of idem_claim_text's fingerprint of JSON text.

For generated and mutated JSON texts, compares what idem_claim_text does
with the text against what the jsonb cast and idem_fingerprint do:

  - a text that jsonb accepts: the claim by text proceeds, a claim of the
    same key with the jsonb is in progress (not a mismatch), and the
    fingerprint stored is idem_fingerprint(text::jsonb);
  - a text that jsonb refuses: idem_claim_text raises the same SQLSTATE,
    message and detail, and writes no record.

The texts: random documents with every escape (short, \\u in both cases,
surrogate pairs, \\/), raw and escaped control characters, characters on
both sides of the UTF-16 versus UTF-8 order of member names (U+E000-U+FFFF
and beyond U+FFFF), repeated names at every depth, numbers of every shape
(and ones numeric_in must read, with a token after them), JSON and
non-JSON whitespace, trailing garbage, mutations of all of these, deep
nesting around the reader's own depth and texts around 16 KB, the length
past which the text goes through jsonb_in.  The same seed gives the same
texts.  Characters the database's encoding lacks are replaced by '?'.

  claim_text.py --dsn DSN [--seed 1] [--cases 1000]

Prints each difference with its text, then "N cases: N accepted,
N refused, N different"; the exit status is 0 only when none differ.
"""

import argparse
import json
import os
import random
import sys

import psycopg2

COMPARE = r"""
CREATE FUNCTION pg_temp.claim_text_vs_jsonb(docs text[], op text)
RETURNS TABLE(n int, by_jsonb text, by_text text) LANGUAGE plpgsql AS $$
DECLARE
    i int;
    state text;
    message text;
    detail text;
    outcome text;
    second text;
BEGIN
    FOR i IN 1 .. coalesce(array_length(docs, 1), 0) LOOP
        n := i;
        BEGIN
            by_jsonb := encode(idem_fingerprint(docs[i]::jsonb), 'hex');
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
                                    detail = PG_EXCEPTION_DETAIL;
            by_jsonb := format('error %s %s (%s)', state, message, detail);
        END;
        BEGIN
            SELECT d.outcome INTO outcome FROM idem_claim_text(op, i::text, docs[i], '') d;
            IF outcome = 'proceed' AND by_jsonb NOT LIKE 'error %' THEN
                SELECT d.outcome INTO second FROM idem_claim(op, i::text, docs[i]::jsonb) d;
                IF second <> 'in_progress' THEN
                    outcome := 'the jsonb''s claim: ' || second;
                END IF;
            END IF;
            SELECT CASE WHEN outcome = 'proceed' THEN encode(r.fingerprint, 'hex')
                        ELSE 'outcome ' || outcome END
              INTO by_text FROM idem_records r WHERE r.operation = op AND r.key = i::text;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
                                    detail = PG_EXCEPTION_DETAIL;
            by_text := format('error %s %s (%s)', state, message, detail);
            IF EXISTS (SELECT FROM idem_records r WHERE r.operation = op AND r.key = i::text) THEN
                by_text := by_text || ', and a record was written';
            END IF;
        END;
        RETURN NEXT;
    END LOOP;
END
$$;
"""

# Numbers: valid and not, exact, huge, tiny, at the digit and exponent
# lengths where the reader hands them to numeric_in.
NUMBERS = [
    '0', '-0', '0.0', '-0.0', '1', '-1', '0.1e1', '1e400', '1E-400', '1e+0', '1e-0', '0e0',
    '9007199254740991', '9007199254740992', '9007199254740993', '-9007199254740993',
    '4.9e-324', '5e-324', '2.2250738585072014e-308', '1.7976931348623157e308',
    '1e-6', '1e-7', '0.000001', '0.0000001', '1e20', '1e21', '123456789012345678901',
    '1e999', '1e-999', '1E+999', '1e0999', '1e00999', '1e1000', '1e-1000', '1e1001',
    '1e131071', '1e131072', '1e-16383', '1e-16384', '0e-99999', '-0e99999', '1e1000000',
    '1' * 39, '1' * 40, '1' * 41, '0.' + '0' * 37 + '1', '0.' + '0' * 38 + '1',
    '1' * 36 + 'e999', '-' + '9' * 35 + 'e-999', '1' * 300,
    # refused
    '01', '00', '-01', '1.', '.5', '+1', '1e', '1e+', '-', '--1', 'NaN', 'Infinity',
    '-Infinity', '0x10', '1_000', '1ee1', '1e1.5', '1.5.3', '0.e1', '-.5', '1 2']

# Characters of strings and names.
CHARS = [
    'a', 'b', 'z', 'A', ' ', '\u00e9', '\u00ff', '\u0100', '\u07ff', '\u0800', '\u20ac',
    '\ud7ff', '\ue000', '\uefff', '\uf000', '\ufb33', '\ufeff', '\ufffd', '\uffff',
    '\U00010000', '\U0001f602', '\U0010ffff', '\u2028', '\u2029', '\x7f', '\x80', '"', '\\',
    '/', '\b', '\f', '\n', '\r', '\t', '\x01', '\x1f', '\u00a0', '\u3000']

# Member names, many of them equal once unescaped, or ordered differently
# by UTF-16 code units and by bytes, some within the first 8 bytes.
NAMES = [
    '"a"', '"b"', '"aa"', '""', '"\\u0061"', '"\u00e9"', '"\\u00e9"', '"\\u00E9"', '"e"',
    '"\U0001f600"', '"\\ud83d\\ude00"', '"\ufb33"', '"\uffff"', '"\ue000"', '"\U00010000"',
    '"\\ud800\\udc00"', '"abcdefgh"', '"abcdefghi"', '"abcdefgh\U00010000"',
    '"abcdefgh\ue000"', '"abcdefg\ue000"', '"abcdefg\U00010000"', '"\\n"', '"\\u0001"',
    '"\x7f"', '"\u0080"', '"a\\u0000"', '"\\ud800"', '"\\udc00x"', '"\\ud800\\u0041"']

SHORT_ESCAPES = {'\b': '\\b', '\f': '\\f', '\n': '\\n', '\r': '\\r', '\t': '\\t'}


class Generator:
    def __init__(self, seed):
        self.rnd = random.Random(seed)

    def escaped(self, c):
        """One character inside a JSON string, escaped in a random valid way."""
        rnd = self.rnd
        code = ord(c)
        if c == '"':
            return rnd.choice(['\\"', '\\u0022'])
        if c == '\\':
            return rnd.choice(['\\\\', '\\u005c', '\\u005C'])
        if c in SHORT_ESCAPES and rnd.random() < 0.5:
            return SHORT_ESCAPES[c]
        if c == '/' and rnd.random() < 0.5:
            return '\\/'
        if code >= 0x20 and rnd.random() < 0.7:
            return c
        form = rnd.choice(['\\u%04x', '\\u%04X'])
        if code > 0xFFFF:
            v = code - 0x10000
            return form % (0xD800 + (v >> 10)) + form % (0xDC00 + (v & 0x3FF))
        return form % code

    def string(self, maxlen=8, valid=True):
        rnd = self.rnd
        chars = [rnd.choice(CHARS) if rnd.random() < 0.5 else rnd.choice('abcxyz')
                 for _ in range(rnd.choice([0, 1, 1, 2, 3, 5, maxlen]))]
        if not valid and rnd.random() < 0.5:
            return '"' + ''.join(chars) + '"'   # raw quotes, backslashes, controls
        return '"' + ''.join(self.escaped(c) for c in chars) + '"'

    def number(self, valid=True):
        rnd = self.rnd
        while True:
            if rnd.random() < 0.4:
                text = rnd.choice(NUMBERS)
            else:
                digits = lambda n: ''.join(rnd.choice('0123456789') for _ in range(n))
                text = rnd.choice(['', '', '-']) + rnd.choice(
                    ['0', str(rnd.randint(1, 9)) + digits(rnd.randint(0, 25))])
                if rnd.random() < 0.5:
                    text += '.' + digits(rnd.randint(1, 25))
                if rnd.random() < 0.5:
                    text += rnd.choice('eE') + rnd.choice(['', '+', '-']) + \
                        digits(rnd.choice([1, 2, 3, 3, 4, 5]))
            if not valid or self.is_json_number(text):
                return text

    @staticmethod
    def is_json_number(text):
        try:
            json.loads(text)
        except ValueError:
            return False
        return 'N' not in text and 'I' not in text and text.strip() == text

    def space(self):
        rnd = self.rnd
        r = rnd.random()
        if r < 0.6:
            return ''
        if r < 0.97:
            return ''.join(rnd.choice([' ', '\n', '\t', '\r\n']) for _ in range(rnd.randint(1, 3)))
        return rnd.choice(['\u00a0', '\u3000', '\x0b', '\x0c', '\ufeff', '\u2028'])

    def value(self, depth=0, valid=True):
        rnd = self.rnd
        r = rnd.random() * (0.5 if depth > 6 else 1)
        if r < 0.15:
            return self.number(valid or rnd.random() < 0.7)
        if r < 0.35:
            return self.string(rnd.choice([8, 8, 16, 200]), valid)
        if r < 0.42:
            return rnd.choice(['true', 'false', 'null'] if valid else ['true', 'nul', 'True', 'truex'])
        sp = self.space
        if r < 0.7:
            items = [sp() + self.value(depth + 1, valid) + sp()
                     for _ in range(rnd.choice([0, 1, 2, 3, 5, 10]))]
            return '[' + sp() + ','.join(items) + ']'
        members = []
        for _ in range(rnd.choice([0, 1, 2, 3, 4, 6, 12])):
            name = rnd.choice(NAMES) if rnd.random() < 0.6 else self.string(6, valid)
            members.append(sp() + name + sp() + ':' + sp() + self.value(depth + 1, valid) + sp())
        if members and rnd.random() < 0.3:
            # names repeated anywhere among the members
            for _ in range(rnd.randint(1, 3)):
                name = rnd.choice(members).split(':', 1)[0]
                members.insert(rnd.randint(0, len(members)), name + ':' + self.value(depth + 1, valid))
        return '{' + sp() + ','.join(members) + '}'

    def mutate(self, text):
        rnd = self.rnd
        chars = list(text)
        for _ in range(rnd.randint(1, 3)):
            at = rnd.randrange(len(chars) + 1)
            r = rnd.random()
            if r < 0.3 and chars:
                del chars[min(at, len(chars) - 1)]
            elif r < 0.6:
                chars.insert(at, rnd.choice(['{', '}', '[', ']', ',', ':', '"', '\\', 'e', '-', '.',
                                             '0', ' ', '\\u', '\\ud800', 'null', '\x01', '\u00e9', 'x']))
            elif r < 0.8:
                return ''.join(chars[:at])
            elif chars:
                chars[min(at, len(chars) - 1)] = rnd.choice(['}', ']', '"', ',', '\\', '0', ' '])
        return ''.join(chars)

    @staticmethod
    def nested(depth, kind):
        return [
            '[' * depth + ']' * depth,
            '{"a":' * depth + '1' + '}' * depth,
            '[{"b":1,"a":' * depth + '[]' + '}]' * depth,
            '[' * depth,
            '[' * depth + ']' * (depth - 1),
            '{"a":["\\n",' * depth + '0' + ']}' * depth][kind]

    def document(self):
        rnd = self.rnd
        r = rnd.random()
        if r < 0.45:
            return self.value()
        if r < 0.6:
            return self.space() + self.value(valid=rnd.random() < 0.5) + self.space()
        if r < 0.8:
            return self.mutate(self.value())
        if r < 0.84:
            return self.value() + rnd.choice(['x', ' x', ',', ']', '}', ' {}', '\u00a0', '\x01', '"', ' 1'])
        if r < 0.86:
            return rnd.choice(['', ' ', '\n', '\ufeff{}', '\u00a0[]', '[]\u00a0', '{}\x0b', 'nul'])
        if r < 0.9:
            depth = rnd.choice([1, 2, 50, 255, 256, 257, 258, 1000, 3000, 8191, 8192, 8193])
            return self.nested(depth, rnd.randrange(6))
        if r < 0.93:
            # {"d": <value>, "p": "xxx"}, about 16 KB long
            inner = '{"d":' + self.value(valid=rnd.random() < 0.8) + ',"p":"'
            fill = rnd.choice([16379, 16380, 16381, 16382, 16383, 16385]) - len(inner.encode())
            return inner + 'x' * max(fill, 0) + '"}'
        if r < 0.96:
            # a number numeric_in reads, and a token (valid or not) right after it
            return (rnd.choice(['[', '{"a":', '', '[1,', '{"b":[']) +
                    rnd.choice(['1e1000000', '-1e-1000000', '1e-16384', '1e131072', '1' * 41,
                                '1e0999', '1' * 200 + 'e-5', '1e' + '0' * 10 + '5']) +
                    rnd.choice([' x', 'x', ' @', '/', ' "abc', ' "\\u12"', ',', ' ]', ' \u00e9',
                                '', ' tru', ' 1', ' :', ' \x01', ' -']) +
                    rnd.choice(['', ']', '}', ']}']))
        return '[' + ','.join(rnd.choice(['1', '"x"', '{}', '[]', self.number()])
                              for _ in range(rnd.randint(1, 2000))) + ']'


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--dsn', required=True)
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--cases', type=int, default=1000)
    parser.add_argument('--batch', type=int, default=100)
    args = parser.parse_args()

    conn = psycopg2.connect(args.dsn)
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute("SELECT pg_encoding_to_char(encoding) FROM pg_database "
                "WHERE datname = current_database()")
    encoding = {'UTF8': 'utf-8', 'LATIN1': 'latin-1', 'SQL_ASCII': 'ascii'}[cur.fetchone()[0]]
    conn.set_client_encoding('UTF8' if encoding == 'utf-8' else 'SQL_ASCII' if encoding == 'ascii' else 'LATIN1')
    cur.execute(COMPARE)

    gen = Generator(args.seed)
    done = accepted = different = 0
    batch = 0
    while done < args.cases:
        docs = []
        for _ in range(min(args.batch, args.cases - done)):
            doc = gen.document().replace('\x00', '')   # no text value holds NUL
            docs.append(doc.encode(encoding, 'replace').decode(encoding))
        batch += 1
        cur.execute('SELECT n, by_jsonb, by_text FROM pg_temp.claim_text_vs_jsonb(%s, %s)',
                    (docs, 'fuzz.%d.%d.%d' % (os.getpid(), args.seed, batch)))
        for n, by_jsonb, by_text in cur.fetchall():
            done += 1
            accepted += not by_jsonb.startswith('error ')
            if by_jsonb != by_text:
                different += 1
                print('DIFFERENT %r\n  jsonb: %s\n  text:  %s' % (docs[n - 1][:300], by_jsonb, by_text))
    print('%d cases: %d accepted, %d refused, %d different' % (done, accepted, done - accepted, different))
    return 1 if different else 0


if __name__ == '__main__':
    sys.exit(main())
