/*
 * POST /payments with an Idempotency-Key, on the idempotency extension.
 *
 * A small HTTP service (the JDK's com.sun.net.httpserver, the PostgreSQL
 * JDBC driver) that shows the one-transaction pattern: the claim, the
 * business write (a row in payments) and idem_complete commit together, and
 * every outcome of idem_claim becomes its HTTP answer (README, "HTTP
 * mapping").
 *
 *     POST /payments          Idempotency-Key: <key>     {"amount": 1250, "currency": "EUR"}
 *     GET  /payments/<id>
 *
 * Build and run (Debian: default-jdk-headless, libpostgresql-jdbc-java):
 *     javac -cp /usr/share/java/postgresql.jar -d classes PaymentsService.java
 *     java -cp /usr/share/java/postgresql.jar:classes PaymentsService --port 8000
 *
 * Connection settings come from libpq's environment variables, read here
 * since JDBC does not: PGHOST (a host name or address: JDBC does not reach
 * a Unix-domain socket; default localhost), PGPORT, PGDATABASE, PGUSER,
 * PGPASSWORD.  Listens on 127.0.0.1; `--port 0` picks a free port.  The
 * first line on stdout is "listening on http://127.0.0.1:PORT".
 *
 * For tests, two request headers that are not part of the request (and so
 * not of its fingerprint) make the handler misbehave:
 *     Simulate-Delay-Ms: N      the handler sleeps N ms (at most 10000) after
 *                               its write, inside the transaction
 *     Simulate-Failure: true    the handler throws after its write: the
 *                               transaction rolls back and the claim with it
 *
 * The JDK has no JSON library: the small reader and writer at the end of
 * this file do what the service needs.  The JDK's server sends header names
 * with only their first letter in capitals ("Idempotent-replayed"): header
 * names are case-insensitive, and clients must compare them so.
 */

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.math.BigInteger;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.Executors;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.postgresql.util.PSQLException;
import org.postgresql.util.ServerErrorMessage;

public final class PaymentsService {
    static final String OPERATION = "payments.create";
    static final int POOL_SIZE = 10;
    static final int MAX_BODY = 1 << 20;

    // SQLSTATEs idem_claim raises for a bad key: invalid_parameter_value and
    // null_value_not_allowed.  The client sent it: 400.
    static final Set<String> BAD_INPUT = Set.of("22023", "22004");

    static final String CLAIM_SQL =
        "SELECT outcome, token, http_status, headers::text, raw_body, error_code, retry_after"
        + " FROM idem_claim(?, ?, ?::jsonb)";

    static final Pattern CURRENCY = Pattern.compile("[A-Z]{3}");
    static final Pattern PAYMENT_PATH = Pattern.compile("/payments/([A-Za-z0-9_]+)");

    /**
     * An HTTP answer: status, headers as [name, value] pairs (in order,
     * repeats kept) and the body's bytes.  The stored response is exactly
     * what was sent, so a replay sends the same bytes.
     */
    record Answer(int status, List<List<String>> headers, byte[] body) {}

    static final List<String> JSON_TYPE = List.of("Content-Type", "application/json");

    /** A JSON answer, with Content-Type and any further name, value pairs. */
    static Answer json(int status, Object body, String... more) {
        List<List<String>> headers = new ArrayList<>();
        headers.add(JSON_TYPE);
        for (int i = 0; i + 1 < more.length; i += 2) {
            headers.add(List.of(more[i], more[i + 1]));
        }
        return new Answer(status, headers, Json.write(body).getBytes(StandardCharsets.UTF_8));
    }

    static final class ClientError extends Exception {
        private static final long serialVersionUID = 1L;
        final int status;
        final String errorCode;

        ClientError(int status, String errorCode, String message) {
            super(message);
            this.status = status;
            this.errorCode = errorCode;
        }
    }

    /**
     * Up to POOL_SIZE connections, opened when first needed; a caller waits
     * (30 s at most) for a free one.  Each connection runs in transactions
     * (autocommit off) and is handed back outside of one.
     */
    static final class Pool {
        private final String url;
        private final Properties props;
        private final Semaphore free = new Semaphore(POOL_SIZE, true);
        private final Deque<Connection> idle = new ArrayDeque<>();

        Pool(String url, Properties props) {
            this.url = url;
            this.props = props;
        }

        Connection take() throws SQLException, InterruptedException {
            if (!free.tryAcquire(30, TimeUnit.SECONDS)) {
                throw new SQLException("no free connection in 30 s");
            }
            Connection conn;
            synchronized (idle) {
                conn = idle.poll();
            }
            try {
                if (conn == null) {
                    conn = DriverManager.getConnection(url, props);
                    conn.setAutoCommit(false);
                }
                return conn;
            } catch (SQLException e) {
                free.release();
                throw e;
            }
        }

        /** Hands a connection back; a broken one is closed instead. */
        void give(Connection conn, boolean broken) {
            try {
                if (broken || conn.isClosed()) {
                    conn.close();
                } else {
                    synchronized (idle) {
                        idle.push(conn);
                    }
                }
            } catch (SQLException e) {
                // closing a broken connection failed: it is dropped all the same
            } finally {
                free.release();
            }
        }

        void close() {
            synchronized (idle) {
                for (Connection conn : idle) {
                    try {
                        conn.close();
                    } catch (SQLException e) {
                        // shutting down
                    }
                }
                idle.clear();
            }
        }
    }

    /** The work of one transaction, given its connection. */
    interface Work {
        Answer run(Connection conn) throws Exception;
    }

    /**
     * Runs work in one transaction: commits when it returns, rolls back when
     * it throws.  The answer is returned only once the commit succeeded.
     */
    static Answer inTransaction(Pool pool, Work work) throws Exception {
        Connection conn = pool.take();
        boolean committed = false;
        boolean broken = false;
        try {
            Answer result = work.run(conn);
            conn.commit();
            committed = true;
            return result;
        } finally {
            if (!committed) {
                try {
                    conn.rollback();
                } catch (SQLException e) {
                    broken = true;
                }
            }
            pool.give(conn, broken);
        }
    }

    /** The handler's own checks: a failure is stored and replayed. */
    static String validate(Map<String, Object> request) {
        Object amount = request.get("amount");
        Object currency = request.get("currency");
        if (!(amount instanceof Json.Number n) || n.asLong() == null || n.asLong() <= 0) {
            return "amount must be a positive integer (minor units)";
        }
        if (!(currency instanceof String c) || !CURRENCY.matcher(c).matches()) {
            return "currency must be a three-letter ISO 4217 code";
        }
        return null;
    }

    static Map<String, Object> error(String errorCode, String message) {
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("error_code", errorCode);
        body.put("message", message);
        return body;
    }

    /** Maps an outcome other than proceed to its answer. */
    static Answer answer(ResultSet d) throws SQLException {
        String outcome = d.getString("outcome");
        String errorCode = d.getString("error_code");
        switch (outcome) {
            case "replay": {
                // The stored status, headers and body bytes, exactly as
                // first sent, and the marker.
                List<List<String>> headers = new ArrayList<>();
                String stored = d.getString("headers");
                if (stored != null) {
                    for (Object pair : (List<?>) Json.parse(stored)) {
                        List<?> p = (List<?>) pair;
                        headers.add(List.of((String) p.get(0), (String) p.get(1)));
                    }
                }
                headers.add(List.of("Idempotent-Replayed", "true"));
                byte[] body = d.getBytes("raw_body");
                return new Answer(d.getInt("http_status"), headers,
                                  body == null ? new byte[0] : body);
            }
            case "in_progress":
                return json(409, error(errorCode, "a request with this Idempotency-Key is still being processed"),
                            "Retry-After", String.valueOf(d.getInt("retry_after")));
            case "mismatch":
                return json(422, error(errorCode, "this Idempotency-Key was used for a different request"));
            case "unknown":
                return json(409, error(errorCode,
                    "the outcome of the first attempt is unknown; query the payment before retrying"));
            case "expired":
                return json(409, error(errorCode,
                    "this Idempotency-Key has expired; look the payment up by its reference before sending it again with a new key"));
            case "rate_limited":
                // Nothing was written: the same request, same key, may come again.
                return json(429, error(errorCode,
                    "too many new requests from this client; send it again after Retry-After seconds, with the same Idempotency-Key"),
                    "Retry-After", String.valueOf(d.getInt("retry_after")));
            default:
                throw new IllegalStateException("unexpected outcome " + outcome);
        }
    }

    /** Claim, write, complete: one transaction. */
    static Answer createPayment(Pool pool, String key, Map<String, Object> request,
                                int delayMs, boolean fail) throws Exception {
        return inTransaction(pool, conn -> {
            try (PreparedStatement claim = conn.prepareStatement(CLAIM_SQL)) {
                claim.setString(1, OPERATION);
                claim.setString(2, key);
                claim.setString(3, Json.write(request));
                ResultSet d;
                try {
                    d = claim.executeQuery();
                } catch (SQLException e) {
                    if (BAD_INPUT.contains(e.getSQLState())) {
                        throw new ClientError(400, "IDEMPOTENCY_KEY_INVALID", primaryMessage(e));
                    }
                    throw e;
                }
                d.next();
                if (!"proceed".equals(d.getString("outcome"))) {
                    // Commit all the same: a claim that found an ended lease
                    // may have moved the record to unknown.
                    return answer(d);
                }
                String token = d.getString("token");
                String problem = validate(request);
                if (problem != null) {
                    // A stable failure: stored, replayed to every retry.
                    Answer a = json(400, error("VALIDATION_FAILED", problem));
                    try (PreparedStatement failed = conn.prepareStatement(
                            "SELECT idem_fail(?, 400, headers => ?::jsonb, raw_body => ?)")) {
                        failed.setString(1, token);
                        failed.setString(2, Json.write(a.headers()));
                        failed.setBytes(3, a.body());
                        failed.execute();
                    }
                    return a;
                }
                long amount = ((Json.Number) request.get("amount")).asLong();
                String currency = (String) request.get("currency");
                String paymentId;
                try (PreparedStatement insert = conn.prepareStatement(
                        "INSERT INTO payments (idempotency_key, amount, currency)"
                        + " VALUES (?, ?, ?) RETURNING id")) {
                    insert.setString(1, key);
                    insert.setLong(2, amount);
                    insert.setString(3, currency);
                    try (ResultSet r = insert.executeQuery()) {
                        r.next();
                        paymentId = r.getString(1);
                    }
                }
                if (delayMs > 0) {
                    Thread.sleep(delayMs);
                }
                if (fail) {
                    throw new IllegalStateException("simulated failure after the write");
                }
                Answer a = json(201, payment(paymentId, amount, currency),
                                "Location", "/payments/" + paymentId);
                try (PreparedStatement complete = conn.prepareStatement(
                        "SELECT idem_complete(?, 201, headers => ?::jsonb, resource_id => ?,"
                        + " raw_body => ?)")) {
                    complete.setString(1, token);
                    complete.setString(2, Json.write(a.headers()));
                    complete.setString(3, paymentId);
                    complete.setBytes(4, a.body());
                    complete.execute();
                }
                return a;
            }
        });
    }

    static Map<String, Object> payment(String id, long amount, String currency) {
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("id", id);
        body.put("amount", amount);
        body.put("currency", currency);
        body.put("status", "created");
        return body;
    }

    static Answer getPayment(Pool pool, String paymentId) throws Exception {
        return inTransaction(pool, conn -> {
            try (PreparedStatement select = conn.prepareStatement(
                    "SELECT id, amount, currency FROM payments WHERE id = ?")) {
                select.setString(1, paymentId);
                try (ResultSet r = select.executeQuery()) {
                    if (!r.next()) {
                        return json(404, error("NOT_FOUND", "no such payment"));
                    }
                    return json(200, payment(r.getString(1), r.getLong(2), r.getString(3)));
                }
            }
        });
    }

    /** The server's message without the "ERROR:" and detail lines JDBC adds. */
    static String primaryMessage(SQLException e) {
        if (e instanceof PSQLException p) {
            ServerErrorMessage m = p.getServerErrorMessage();
            if (m != null && m.getMessage() != null) {
                return m.getMessage();
            }
        }
        return e.getMessage();
    }

    static final class Handler {
        private final Pool pool;
        private final boolean verbose;

        Handler(Pool pool, boolean verbose) {
            this.pool = pool;
            this.verbose = verbose;
        }

        void handle(HttpExchange ex) throws IOException {
            String method = ex.getRequestMethod();
            String path = ex.getRequestURI().getRawPath()
                + (ex.getRequestURI().getRawQuery() == null ? "" : "?" + ex.getRequestURI().getRawQuery());
            Answer result;
            try {
                result = route(ex, method, path);
            } catch (ClientError e) {
                result = json(e.status, error(e.errorCode, e.getMessage()));
            } catch (Exception e) { // the transaction rolled back: a retry proceeds
                System.err.println(method + " " + path + " failed: " + e);
                result = json(500, error("INTERNAL_ERROR", "try again"));
            }
            try {
                respond(ex, result);
            } finally {
                ex.close();
            }
            if (verbose) {
                System.err.println(method + " " + path + " " + result.status());
            }
        }

        private Answer route(HttpExchange ex, String method, String path) throws Exception {
            if (method.equals("POST") && path.equals("/payments")) {
                String key = ex.getRequestHeaders().getFirst("Idempotency-Key");
                if (key == null) {
                    throw new ClientError(400, "IDEMPOTENCY_KEY_MISSING",
                                          "the Idempotency-Key header is required");
                }
                Object request;
                try {
                    request = Json.parse(new String(readBody(ex.getRequestBody()), StandardCharsets.UTF_8));
                } catch (IllegalArgumentException e) {
                    request = null;
                }
                if (!(request instanceof Map)) {
                    throw new ClientError(400, "INVALID_JSON", "the body must be a JSON object");
                }
                @SuppressWarnings("unchecked")
                Map<String, Object> fields = (Map<String, Object>) request;
                int delayMs;
                try {
                    String delay = ex.getRequestHeaders().getFirst("Simulate-Delay-Ms");
                    BigInteger ms = new BigInteger(delay == null ? "0" : delay.strip());
                    delayMs = ms.max(BigInteger.ZERO).min(BigInteger.valueOf(10000)).intValue();
                } catch (NumberFormatException e) {
                    throw new ClientError(400, "INVALID_HEADER", "Simulate-Delay-Ms must be an integer");
                }
                String failure = ex.getRequestHeaders().getFirst("Simulate-Failure");
                boolean fail = failure != null && failure.equalsIgnoreCase("true");
                return createPayment(pool, key, fields, delayMs, fail);
            }
            Matcher m = PAYMENT_PATH.matcher(path);
            if (method.equals("GET") && m.matches()) {
                return getPayment(pool, m.group(1));
            }
            throw new ClientError(404, "NOT_FOUND", "no such resource");
        }

        private static byte[] readBody(InputStream in) throws IOException, ClientError {
            byte[] data = in.readNBytes(MAX_BODY + 1);
            if (data.length > MAX_BODY) {
                throw new ClientError(413, "BODY_TOO_LARGE", "the body is too large");
            }
            return data;
        }

        private static void respond(HttpExchange ex, Answer a) throws IOException {
            byte[] data = a.body();
            for (List<String> h : a.headers()) {
                ex.getResponseHeaders().add(h.get(0), h.get(1));
            }
            ex.sendResponseHeaders(a.status(), data.length == 0 ? -1 : data.length);
            if (data.length > 0) {
                try (OutputStream out = ex.getResponseBody()) {
                    out.write(data);
                }
            }
        }
    }

    /** The JDBC URL and properties of libpq's environment variables. */
    static Pool poolFromEnvironment() {
        String host = System.getenv().getOrDefault("PGHOST", "localhost");
        if (host.isEmpty() || host.startsWith("/")) {
            throw new IllegalArgumentException(
                "PGHOST must name a host: JDBC does not reach a Unix-domain socket");
        }
        String port = System.getenv().getOrDefault("PGPORT", "5432");
        String user = System.getenv().getOrDefault("PGUSER", System.getProperty("user.name"));
        String database = System.getenv().getOrDefault("PGDATABASE", user);
        String url = "jdbc:postgresql://" + (host.contains(":") ? "[" + host + "]" : host) + ":" + port
            + "/" + URLEncoder.encode(database, StandardCharsets.UTF_8).replace("+", "%20");
        Properties props = new Properties();
        props.setProperty("user", user);
        String password = System.getenv("PGPASSWORD");
        if (password != null) {
            props.setProperty("password", password);
        }
        props.setProperty("ApplicationName", "idempotency-example-java");
        return new Pool(url, props);
    }

    public static void main(String[] args) throws Exception {
        int port = 8000;
        boolean verbose = true;
        for (int i = 0; i < args.length; i++) {
            if (args[i].equals("--port") && i + 1 < args.length) {
                port = Integer.parseInt(args[++i]);
            } else if (args[i].equals("--quiet")) { // no access log; errors are logged all the same
                verbose = false;
            } else {
                System.err.println("usage: PaymentsService [--port N] [--quiet]");
                System.exit(2);
            }
        }
        Pool pool = poolFromEnvironment();
        Handler handler = new Handler(pool, verbose);
        // A backlog of 128: 20 clients at once must not overflow it.
        HttpServer server = HttpServer.create(
            new InetSocketAddress(InetAddress.getByName("127.0.0.1"), port), 128);
        server.createContext("/", handler::handle);
        server.setExecutor(Executors.newCachedThreadPool(r -> {
            Thread t = new Thread(r);
            t.setDaemon(true);
            return t;
        }));
        server.start();
        System.out.println("listening on http://127.0.0.1:" + server.getAddress().getPort());
        System.out.flush();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            server.stop(0);
            pool.close();
        }));
    }

    /**
     * JSON as this service needs it: objects as maps, arrays as lists,
     * strings, numbers kept as their text (Json.Number), true, false and
     * null.  write() keeps a map's own key order and escapes non-ASCII
     * characters; replays need nothing of it, since the response is stored
     * as the bytes sent.
     */
    static final class Json {
        record Number(String text) {
            /** The value when it is an integer that fits a long, else null. */
            Long asLong() {
                try {
                    return Long.valueOf(text);
                } catch (NumberFormatException e) {
                    return null;
                }
            }
        }

        private final String s;
        private int i;

        private Json(String s) {
            this.s = s;
        }

        /** Parses one JSON value (RFC 8259); IllegalArgumentException if it is not one. */
        static Object parse(String text) {
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
        static Map<String, Object> object(String text) {
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
            if (c == '{') {
                i++;
                Map<String, Object> m = new LinkedHashMap<>();
                if (eat('}')) {
                    return m;
                }
                do {
                    space();
                    String k = string();
                    expect(':');
                    m.put(k, value()); // the last of duplicate keys wins, as in jsonb
                } while (eat(','));
                expect('}');
                return m;
            }
            if (c == '[') {
                i++;
                List<Object> l = new ArrayList<>();
                if (eat(']')) {
                    return l;
                }
                do {
                    l.add(value());
                } while (eat(','));
                expect(']');
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
        static String write(Object v) {
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
}
