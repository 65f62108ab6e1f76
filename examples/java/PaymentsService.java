/*
 * POST /payments with an Idempotency-Key, on the idempotency extension.
 *
 * A small HTTP service (the JDK's com.sun.net.httpserver) on the JDBC
 * helper of clients/java (idempotency.Idempotency): the claim, the business
 * write (a row in payments) and the completion commit together, and every
 * outcome of idem_claim becomes its HTTP answer (README, "HTTP mapping").
 * What is left here is the business logic and the routes.  (A servlet
 * container would use idempotency.IdempotencyFilter instead.)
 *
 *     POST /payments          Idempotency-Key: <key>     {"amount": 1250, "currency": "EUR"}
 *     GET  /payments/<id>
 *
 * Build and run (Debian: default-jdk-headless, libpostgresql-jdbc-java, and
 * clients/java built into idempotency.jar):
 *     javac -cp idempotency.jar -d classes PaymentsService.java
 *     java -cp /usr/share/java/postgresql.jar:idempotency.jar:classes PaymentsService --port 8000
 *
 * Connection settings come from libpq's environment variables, read by
 * idempotency.Pool since JDBC does not: PGHOST (a host name or address),
 * PGPORT, PGDATABASE, PGUSER, PGPASSWORD.  --no-prepared-statements sets
 * the driver's prepareThreshold=0, so that it never prepares a named
 * statement, for a pooler in transaction mode that does not carry prepared
 * statements from one transaction to the next (pgbouncer before 1.21).
 * Listens on 127.0.0.1; `--port 0` picks a free port.  The first line on
 * stdout is "listening on http://127.0.0.1:PORT".
 *
 * For tests, two request headers that are not part of the request (and so
 * not of its fingerprint) make the handler misbehave:
 *     Simulate-Delay-Ms: N      the handler sleeps N ms (at most 10000) after
 *                               its write, inside the transaction
 *     Simulate-Failure: true    the handler throws after its write: the
 *                               transaction rolls back and the claim with it
 *
 * The JDK's server sends header names with only their first letter in
 * capitals ("Idempotent-replayed"): header names are case-insensitive, and
 * clients must compare them so.
 */

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import idempotency.Idempotency;
import idempotency.Idempotency.HttpError;
import idempotency.Idempotency.Result;
import idempotency.Json;
import idempotency.Pool;
import java.io.IOException;
import java.io.OutputStream;
import java.math.BigInteger;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Executors;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

public final class PaymentsService {
    static final int POOL_SIZE = 10;
    static final int MAX_BODY = 1 << 20;
    static final Pattern CURRENCY = Pattern.compile("[A-Z]{3}");
    static final Pattern PAYMENT_PATH = Pattern.compile("/payments/([A-Za-z0-9_]+)");

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

    static Map<String, Object> payment(String id, long amount, String currency) {
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("id", id);
        body.put("amount", amount);
        body.put("currency", currency);
        body.put("status", "created");
        return body;
    }

    /** Runs once per key, inside the claim's transaction, on its connection. */
    static Result createPayment(Connection conn, Idempotency.Attempt attempt, Map<String, Object> request,
                                int delayMs, boolean fail) throws Exception {
        String problem = validate(request);
        if (problem != null) {
            return Result.json(400, error("VALIDATION_FAILED", problem)).asFailure();
        }
        long amount = ((Json.Number) request.get("amount")).asLong();
        String currency = (String) request.get("currency");
        String id;
        try (PreparedStatement insert = conn.prepareStatement(
                "INSERT INTO payments (idempotency_key, amount, currency) VALUES (?, ?, ?) RETURNING id")) {
            insert.setString(1, attempt.key());
            insert.setLong(2, amount);
            insert.setString(3, currency);
            try (ResultSet r = insert.executeQuery()) {
                r.next();
                id = r.getString(1);
            }
        }
        Thread.sleep(delayMs);
        if (fail) {
            throw new IllegalStateException("simulated failure after the write");
        }
        return Result.json(201, payment(id, amount, currency), "Location", "/payments/" + id).withResourceId(id);
    }

    static Idempotency.Response getPayment(Pool pool, String paymentId) throws SQLException {
        Connection conn = pool.take();
        boolean broken = true;
        try (PreparedStatement select = conn.prepareStatement(
                "SELECT id, amount, currency FROM payments WHERE id = ?")) {
            select.setString(1, paymentId);
            Result result;
            try (ResultSet r = select.executeQuery()) {
                result = r.next() ? Result.json(200, payment(r.getString(1), r.getLong(2), r.getString(3)))
                                  : Result.json(404, error("NOT_FOUND", "no such payment"));
            }
            conn.rollback();
            broken = false;
            return new Idempotency.Response(result.status(), result.headers(), result.body(), null, false);
        } finally {
            pool.give(conn, broken);
        }
    }

    static final class Handler {
        private final Pool pool;
        private final Idempotency idem;
        private final boolean verbose;

        Handler(Pool pool, boolean verbose) {
            this.pool = pool;
            this.idem = new Idempotency(pool);
            this.verbose = verbose;
        }

        void handle(HttpExchange ex) throws IOException {
            String method = ex.getRequestMethod();
            String path = ex.getRequestURI().getRawPath()
                + (ex.getRequestURI().getRawQuery() == null ? "" : "?" + ex.getRequestURI().getRawQuery());
            Idempotency.Response result;
            try {
                result = route(ex, method, path);
            } catch (HttpError e) {
                result = e.response();
            } catch (Exception e) { // the transaction rolled back: a retry proceeds
                System.err.println(method + " " + path + " failed: " + e);
                result = new HttpError(500, "INTERNAL_ERROR", "try again").response();
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

        private Idempotency.Response route(HttpExchange ex, String method, String path) throws Exception {
            if (method.equals("POST") && path.equals("/payments")) {
                byte[] data = ex.getRequestBody().readNBytes(MAX_BODY + 1);
                if (data.length > MAX_BODY) {
                    throw new HttpError(413, "BODY_TOO_LARGE", "the body is too large");
                }
                String text = Idempotency.bodyText(data);
                Map<String, Object> request;
                try {
                    request = Json.object(text);
                } catch (IllegalArgumentException e) {
                    throw new HttpError(400, "INVALID_JSON", "the body must be a JSON object");
                }
                int delayMs;
                try {
                    String delay = ex.getRequestHeaders().getFirst("Simulate-Delay-Ms");
                    BigInteger ms = new BigInteger(delay == null ? "0" : delay.strip());
                    delayMs = ms.max(BigInteger.ZERO).min(BigInteger.valueOf(10000)).intValue();
                } catch (NumberFormatException e) {
                    throw new HttpError(400, "INVALID_HEADER", "Simulate-Delay-Ms must be an integer");
                }
                String failure = ex.getRequestHeaders().getFirst("Simulate-Failure");
                boolean fail = failure != null && failure.equalsIgnoreCase("true");
                // The JDK's server trims header values: a key sent with a
                // control character at its end comes without it
                // (docs/clients.md).
                String key = Idempotency.headerKey(ex.getRequestHeaders().get("Idempotency-Key"));
                return idem.run(Idempotency.Call.of("payments.create", key, text),
                                (conn, attempt) -> createPayment(conn, attempt, request, delayMs, fail));
            }
            Matcher m = PAYMENT_PATH.matcher(path);
            if (method.equals("GET") && m.matches()) {
                return getPayment(pool, m.group(1));
            }
            throw new HttpError(404, "NOT_FOUND", "no such resource");
        }

        private static void respond(HttpExchange ex, Idempotency.Response a) throws IOException {
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

    public static void main(String[] args) throws Exception {
        int port = 8000;
        boolean verbose = true;
        Properties driver = new Properties();
        for (int i = 0; i < args.length; i++) {
            if (args[i].equals("--port") && i + 1 < args.length) {
                port = Integer.parseInt(args[++i]);
            } else if (args[i].equals("--quiet")) { // no access log; errors are logged all the same
                verbose = false;
            } else if (args[i].equals("--no-prepared-statements")) {
                driver.setProperty("prepareThreshold", "0");
            } else {
                System.err.println("usage: PaymentsService [--port N] [--no-prepared-statements] [--quiet]");
                System.exit(2);
            }
        }
        Pool pool = Pool.fromEnvironment(POOL_SIZE, "idempotency-example-java", driver);
        Handler handler = new Handler(pool, verbose);
        // The JDK's server writes the headers and the body of an answer
        // apart: with Nagle's algorithm on, the body waits for the client's
        // delayed ACK of the headers (40 ms on Linux) whenever a client
        // sends its next request on the same connection.  Read when the
        // server's class loads.
        System.setProperty("sun.net.httpserver.nodelay", "true");
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
}
