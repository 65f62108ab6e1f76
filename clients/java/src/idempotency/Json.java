/*
 * JSON as the library and a small service need it: objects as maps (their
 * key order kept), arrays as lists, strings, numbers kept as their text
 * (Json.Number), true, false and null.  The JDK has none.
 */
package idempotency;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

public final class Json {
    public record Number(String text) {
        /** The value when it is an integer that fits a long, else null. */
        public Long asLong() {
            try {
                return Long.valueOf(text);
            } catch (NumberFormatException e) {
                return null;
            }
        }
    }

    /**
     * How deep a body may nest arrays and objects (the outer one counts):
     * the same limit in every library (clients/conformance.json).  The
     * parser refuses deeper text too, rather than recurse until
     * StackOverflowError.
     */
    public static final int MAX_NESTING = 512;

    private final String s;
    private int i;
    private int depth;

    /** JSON text without the whitespace outside its strings (how every library replays a jsonb body). */
    public static String compact(String text) {
        StringBuilder b = new StringBuilder(text.length());
        boolean inString = false;
        for (int k = 0; k < text.length(); k++) {
            char c = text.charAt(k);
            if (inString) {
                if (c == '\\' && k + 1 < text.length()) {
                    b.append(c);
                    c = text.charAt(++k);
                } else if (c == '"') {
                    inString = false;
                }
            } else if (c == '"') {
                inString = true;
            } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
                continue;
            }
            b.append(c);
        }
        return b.toString();
    }

    /** Whether JSON text nests arrays and objects deeper than limit (brackets in strings not counted). */
    public static boolean tooDeep(String text, int limit) {
        int d = 0;
        boolean inString = false;
        for (int k = 0; k < text.length(); k++) {
            char c = text.charAt(k);
            if (inString) {
                if (c == '\\') {
                    k++;
                } else if (c == '"') {
                    inString = false;
                }
            } else if (c == '"') {
                inString = true;
            } else if (c == '[' || c == '{') {
                if (++d > limit) {
                    return true;
                }
            } else if (c == ']' || c == '}') {
                d--;
            }
        }
        return false;
    }

    private Json(String s) {
        this.s = s;
    }

    /** Parses one JSON value (RFC 8259); IllegalArgumentException if it is not one. */
    public static Object parse(String text) {
        Json p = new Json(text);
        Object v = p.value();
        p.space();
        if (p.i != p.s.length()) {
            throw p.bad("trailing characters");
        }
        return v;
    }

    /** Parses a JSON object. */
    @SuppressWarnings("unchecked")
    public static Map<String, Object> object(String text) {
        Object v = parse(text);
        if (!(v instanceof Map)) {
            throw new IllegalArgumentException("not a JSON object");
        }
        return (Map<String, Object>) v;
    }

    private IllegalArgumentException bad(String what) {
        return new IllegalArgumentException("invalid JSON at " + i + ": " + what);
    }

    private void space() {
        while (i < s.length() && " \t\r\n".indexOf(s.charAt(i)) >= 0) {
            i++;
        }
    }

    private boolean eat(char c) {
        space();
        if (i < s.length() && s.charAt(i) == c) {
            i++;
            return true;
        }
        return false;
    }

    private void expect(char c) {
        if (!eat(c)) {
            throw bad("expected '" + c + "'");
        }
    }

    private Object value() {
        space();
        if (i >= s.length()) {
            throw bad("unexpected end");
        }
        char c = s.charAt(i);
        if ((c == '{' || c == '[') && depth >= MAX_NESTING) {
            throw bad("nested more than " + MAX_NESTING + " deep");
        }
        if (c == '{') {
            i++;
            depth++;
            Map<String, Object> m = new LinkedHashMap<>();
            if (!eat('}')) {
                do {
                    space();
                    String k = string();
                    expect(':');
                    m.put(k, value()); // the last of duplicate keys wins, as in jsonb
                } while (eat(','));
                expect('}');
            }
            depth--;
            return m;
        }
        if (c == '[') {
            i++;
            depth++;
            List<Object> l = new ArrayList<>();
            if (!eat(']')) {
                do {
                    l.add(value());
                } while (eat(','));
                expect(']');
            }
            depth--;
            return l;
        }
        if (c == '"') {
            return string();
        }
        for (String word : new String[] {"true", "false", "null"}) {
            if (s.startsWith(word, i)) {
                i += word.length();
                return word.equals("null") ? null : Boolean.valueOf(word);
            }
        }
        return number();
    }

    private static final Pattern NUMBER =
        Pattern.compile("-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?");

    private Number number() {
        Matcher m = NUMBER.matcher(s).region(i, s.length());
        if (!m.lookingAt()) {
            throw bad("unexpected character");
        }
        i = m.end();
        return new Number(m.group());
    }

    private String string() {
        if (i >= s.length() || s.charAt(i) != '"') {
            throw bad("expected a string");
        }
        i++;
        StringBuilder b = new StringBuilder();
        while (true) {
            if (i >= s.length()) {
                throw bad("unterminated string");
            }
            char c = s.charAt(i++);
            if (c == '"') {
                return b.toString();
            }
            if (c < 0x20) {
                throw bad("control character in a string");
            }
            if (c != '\\') {
                b.append(c);
                continue;
            }
            if (i >= s.length()) {
                throw bad("unterminated string");
            }
            char e = s.charAt(i++);
            switch (e) {
                case '"', '\\', '/' -> b.append(e);
                case 'b' -> b.append('\b');
                case 'f' -> b.append('\f');
                case 'n' -> b.append('\n');
                case 'r' -> b.append('\r');
                case 't' -> b.append('\t');
                case 'u' -> {
                    if (i + 4 > s.length()) {
                        throw bad("short \\u escape");
                    }
                    try {
                        b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                    } catch (NumberFormatException x) {
                        throw bad("bad \\u escape");
                    }
                    i += 4;
                }
                default -> throw bad("bad escape");
            }
        }
    }

    /** Writes a value compactly, object keys in the map's order. */
    public static String write(Object v) {
        StringBuilder b = new StringBuilder();
        write(b, v);
        return b.toString();
    }

    private static void write(StringBuilder b, Object v) {
        if (v == null) {
            b.append("null");
        } else if (v instanceof String str) {
            quote(b, str);
        } else if (v instanceof Number n) {
            b.append(n.text());
        } else if (v instanceof Long || v instanceof Integer || v instanceof Boolean) {
            b.append(v);
        } else if (v instanceof Map<?, ?> m) {
            b.append('{');
            String sep = "";
            for (Map.Entry<?, ?> e : m.entrySet()) {
                b.append(sep);
                quote(b, (String) e.getKey());
                b.append(':');
                write(b, e.getValue());
                sep = ",";
            }
            b.append('}');
        } else if (v instanceof List<?> l) {
            b.append('[');
            String sep = "";
            for (Object e : l) {
                b.append(sep);
                write(b, e);
                sep = ",";
            }
            b.append(']');
        } else {
            throw new IllegalArgumentException("cannot write " + v.getClass());
        }
    }

    private static void quote(StringBuilder b, String str) {
        b.append('"');
        for (int k = 0; k < str.length(); k++) {
            char c = str.charAt(k);
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                default -> {
                    if (c < 0x20 || c > 0x7e) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
                }
            }
        }
        b.append('"');
    }
}
