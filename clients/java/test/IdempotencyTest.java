/*
 * Tests of clients/java against a running PostgreSQL with the extension and
 * examples/schema.sql, from libpq's environment (PGHOST, PGPORT,
 * PGDATABASE, PGUSER: the role the schema grants the API to).  A plain main:
 * prints one line per check and "N passed, N failed"; exits 1 when one failed.
 *
 *     java -cp postgresql.jar:servlet-api.jar:idempotency.jar:classes IdempotencyTest
 */

import idempotency.Idempotency;
import idempotency.Idempotency.Call;
import idempotency.Idempotency.Response;
import idempotency.Idempotency.Result;
import idempotency.IdempotencyFilter;
import idempotency.Json;
import idempotency.Pool;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.lang.reflect.Proxy;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import javax.servlet.FilterChain;
import javax.servlet.ServletOutputStream;
import javax.servlet.WriteListener;
import javax.servlet.http.HttpServletRequest;
import javax.servlet.http.HttpServletResponse;

public final class IdempotencyTest {
    static int passed;
    static int failed;
    static final String RUN = UUID.randomUUID().toString().substring(0, 8);

    static void check(String name, boolean ok, Object detail) {
        if (ok) {
            passed++;
            System.out.println("ok     " + name);
        } else {
            failed++;
            System.out.println("FAILED " + name + ": " + detail);
        }
    }

    static String op(String name) {
        return "test.java." + name + "." + RUN;
    }

    static String code(Response r) {
        return (String) Json.object(new String(r.body(), StandardCharsets.UTF_8)).get("error_code");
    }

    static Result pay(Connection conn, Idempotency.Attempt a, long amount) throws Exception {
        try (PreparedStatement ps = conn.prepareStatement(
                "INSERT INTO payments (idempotency_key, amount, currency) VALUES (?, ?, 'EUR') RETURNING id")) {
            ps.setString(1, a.key());
            ps.setLong(2, amount);
            try (ResultSet r = ps.executeQuery()) {
                r.next();
                String id = r.getString(1);
                return Result.json(201, Map.of("id", id), "Location", "/payments/" + id, "X-Tag", "a", "X-Tag", "b")
                    .withResourceId(id);
            }
        }
    }

    static int payments(Pool pool, String key) throws Exception {
        Connection conn = pool.take();
        try (PreparedStatement ps = conn.prepareStatement("SELECT count(*) FROM payments WHERE idempotency_key = ?")) {
            ps.setString(1, key);
            try (ResultSet r = ps.executeQuery()) {
                r.next();
                return r.getInt(1);
            }
        } finally {
            conn.rollback();
            pool.give(conn, false);
        }
    }

    static final Idempotency.Handler NEVER = (conn, a) -> {
        throw new AssertionError("the handler must not run");
    };

    static void core(Pool pool, Idempotency idem) throws Exception {
        String key = UUID.randomUUID().toString();
        Call call = Call.of(op("core"), key, "{\"amount\": 10, \"currency\": \"EUR\"}");
        Response first = idem.run(call, (conn, a) -> pay(conn, a, 10));
        check("a new key runs the handler: 201 with its header pairs",
              first.status() == 201 && first.headers().size() == 4 && !first.replayed(), first);
        Response again = idem.run(Call.of(call.operation(), key, "{\"currency\": \"EUR\", \"amount\": 10}"), NEVER);
        check("a retry replays status, header pairs and body bytes, with Idempotent-Replayed",
              again.replayed() && again.status() == 201 && Arrays.equals(again.body(), first.body())
              && again.headers().size() == 5 && again.headers().get(2).equals(first.headers().get(2))
              && "true".equals(again.header("Idempotent-Replayed")), again);
        Response other = idem.run(Call.of(call.operation(), key, "{\"amount\": 11}"), NEVER);
        check("another request with the key: 422", other.status() == 422
              && "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST".equals(code(other)), other);
        check("one payment", payments(pool, key) == 1, payments(pool, key));
        Response missing = idem.run(Call.of(op("core"), null, "{}"), NEVER);
        check("a missing key: 400 IDEMPOTENCY_KEY_MISSING", "IDEMPOTENCY_KEY_MISSING".equals(code(missing)), missing);
        for (String bad : List.of("", "k".repeat(300), "caf\u00e9")) {
            Response r = idem.run(Call.of(op("core"), bad, "{}"), NEVER);
            check("an invalid key (" + bad.length() + " characters): 400 IDEMPOTENCY_KEY_INVALID",
                  r.status() == 400 && "IDEMPOTENCY_KEY_INVALID".equals(code(r)), r);
        }
        String rollback = UUID.randomUUID().toString();
        Call rb = Call.of(op("core"), rollback, "{\"amount\": 12}");
        try {
            idem.run(rb, (conn, a) -> {
                pay(conn, a, 12);
                throw new IllegalStateException("boom");
            });
            check("a handler that throws: the exception goes on", false, "no exception");
        } catch (IllegalStateException e) {
            check("a handler that throws rolls everything back", payments(pool, rollback) == 0, e);
        }
        Response retry = idem.run(rb, (conn, a) -> pay(conn, a, 12));
        check("  ... and its retry proceeds", retry.status() == 201 && payments(pool, rollback) == 1, retry);
        String fkey = UUID.randomUUID().toString();
        Call fc = Call.of(op("core"), fkey, "{\"amount\": 0}");
        Response f = idem.run(fc, (conn, a) -> Result.json(400, Map.of("error_code", "VALIDATION_FAILED")).asFailure());
        Response f2 = idem.run(fc, NEVER);
        check("a failure is stored with idem_fail and replayed",
              f.status() == 400 && f2.replayed() && Arrays.equals(f.body(), f2.body()), f2);
        String busy = UUID.randomUUID().toString();
        CountDownLatch inside = new CountDownLatch(1);
        CountDownLatch release = new CountDownLatch(1);
        CompletableFuture<Response> slow = CompletableFuture.supplyAsync(() -> {
            try {
                return idem.run(Call.of(op("core"), busy, "{}"), (conn, a) -> {
                    inside.countDown();
                    release.await(30, TimeUnit.SECONDS);
                    return pay(conn, a, 13);
                });
            } catch (Exception e) {
                throw new RuntimeException(e);
            }
        });
        inside.await(30, TimeUnit.SECONDS);
        Response r = idem.run(Call.of(op("core"), busy, "{}"), NEVER);
        release.countDown();
        check("a key held by a running attempt: 409 with Retry-After", r.status() == 409
              && "IDEMPOTENCY_REQUEST_IN_PROGRESS".equals(code(r)) && r.header("Retry-After") != null, r);
        check("  ... which then ends with 201", slow.get(30, TimeUnit.SECONDS).status() == 201, slow);
    }

    /**
     * Header values are checked as the strictest server checks them
     * (node:http: a token name; no character above U+00FF, no control
     * character but HTAB) before they are stored: the JDK's server writes
     * each char as one byte, so "\u010d\u010a" would be CR LF on the wire.
     */
    static void headers(Pool pool, Idempotency idem) throws Exception {
        List<List<String>> bad = List.of(
            List.of("X-Note", "ok\u010d\u010aSet-Cookie: session=attacker"),
            List.of("X-Note", "a\r\nSet-Cookie: x=y"), List.of("X-Note", "a\nb"), List.of("X-Note", "a\u0000b"),
            List.of("X-Note", "a\u0001b"), List.of("X-Note", "a\u007fb"), List.of("X-Note", "caf\u0107"),
            List.of("X Note", "a"), List.of("X-Note:", "a"), List.of("", "a"), List.of("X-N\u00f6te", "a"));
        for (List<String> h : bad) {
            String key = UUID.randomUUID().toString();
            Call call = Call.of(op("headers"), key, "{\"amount\": 14}");
            String what = Json.write(h);
            try {
                Response r = idem.run(call, (conn, a) -> {
                    pay(conn, a, 14);
                    return Result.of(201, List.of(h), new byte[0]);
                });
                check("a header the strictest server refuses is refused before it is stored: " + what, false, r);
            } catch (IllegalArgumentException e) {
                Response retry = idem.run(call, (conn, a) -> pay(conn, a, 14));
                check("a header the strictest server refuses is refused before it is stored, rolled back, "
                      + "the retry proceeds: " + what,
                      payments(pool, key) == 1 && retry.status() == 201 && !retry.replayed(), retry);
            }
        }
        String key = UUID.randomUUID().toString();
        Response ok = idem.run(Call.of(op("headers"), key, "{}"),
                               (conn, a) -> Result.of(200, List.of(List.of("X-Note", "tab\there, caf\u00e9 ~")), null));
        Response replay = idem.run(Call.of(op("headers"), key, "{}"), NEVER);
        check("a header value of HTAB, printable ASCII and U+0080..U+00FF is stored and replayed",
              replay.replayed() && "tab\there, caf\u00e9 ~".equals(replay.header("X-Note")), replay);
        // A record stored by another client of the records, with a value
        // no server may send: its replay is refused, never sent.
        String stored = UUID.randomUUID().toString();
        Connection conn = pool.take();
        try (PreparedStatement ps = conn.prepareStatement(
                "SELECT idem_complete((SELECT token FROM idem_claim(?, ?)), 200,"
                + " headers => '[[\"X-Note\", \"ok\\u010d\\u010aSet-Cookie: a=b\"]]')")) {
            ps.setString(1, op("headers"));
            ps.setString(2, stored);
            ps.execute();
            conn.commit();
        } finally {
            pool.give(conn, false);
        }
        try {
            Response r = idem.run(Call.of(op("headers"), stored, null), NEVER);
            check("the replay of a stored header no server may send is refused", false, r);
        } catch (IllegalStateException e) {
            check("the replay of a stored header no server may send is refused", true, e);
        }
    }

    static void external(Idempotency idem) throws Exception {
        String key = UUID.randomUUID().toString();
        Call call = Call.of(op("external"), key, "{}").withLease(Duration.ofSeconds(5));
        CountDownLatch inside = new CountDownLatch(1);
        CountDownLatch release = new CountDownLatch(1);
        String[] derived = new String[1];
        CompletableFuture<Response> first = CompletableFuture.supplyAsync(() -> {
            try {
                return idem.runExternal(call, e -> {
                    derived[0] = e.deriveKey("charge");
                    inside.countDown();
                    release.await(30, TimeUnit.SECONDS);
                    return Result.json(201, Map.of("charged", true));
                });
            } catch (Exception e) {
                throw new RuntimeException(e);
            }
        });
        inside.await(30, TimeUnit.SECONDS);
        Response busy = idem.runExternal(call, e -> null);
        release.countDown();
        Response done = first.get(30, TimeUnit.SECONDS);
        check("external: the claim commits, a retry meanwhile is in_progress",
              "in_progress".equals(busy.outcome()) && done.status() == 201 && derived[0].length() == 36, busy);
        check("external: then it replays", idem.runExternal(call, e -> null).replayed(), "");

        Call lost = Call.of(op("external"), UUID.randomUUID().toString(), "{}").withLease(Duration.ofMillis(50));
        try {
            idem.runExternal(lost, e -> {
                throw new IllegalStateException("timeout");
            });
        } catch (IllegalStateException e) {
            // the outcome is unknown
        }
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        Response r;
        do {
            r = idem.runExternal(lost, e -> null);
        } while ("in_progress".equals(r.outcome()) && System.nanoTime() < deadline && sleep(20));
        check("external: an error is unknown once the lease ends (409 IDEMPOTENCY_OUTCOME_UNKNOWN)",
              r.status() == 409 && "IDEMPOTENCY_OUTCOME_UNKNOWN".equals(code(r)), r);

        Call again = Call.of(op("external"), UUID.randomUUID().toString(), "{}");
        Response retryable = idem.runExternal(again, e -> {
            throw new Idempotency.RetryableException("provider down");
        });
        Response second = idem.runExternal(again, e -> Result.json(200, Map.of("attempt", e.attempt.attempt())));
        check("external: RetryableException is 503, and the retry runs as attempt 2",
              retryable.status() == 503 && "1".equals(retryable.header("Retry-After"))
              && new String(second.body(), StandardCharsets.UTF_8).equals("{\"attempt\":2}"), second);
    }

    static boolean sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        return true;
    }

    /** A request of the servlet API, as far as the filter uses it. */
    static HttpServletRequest request(String key, String body) {
        return request(key, body.getBytes(StandardCharsets.UTF_8));
    }

    static HttpServletRequest request(String key, byte[] body) {
        return request(key == null ? List.of() : List.of(key), body);
    }

    /** A POST with these Idempotency-Key header lines. */
    static HttpServletRequest request(List<String> keys, byte[] body) {
        String key = keys.isEmpty() ? null : keys.get(0);
        Map<String, Object> attributes = new HashMap<>();
        return (HttpServletRequest) Proxy.newProxyInstance(IdempotencyTest.class.getClassLoader(),
            new Class<?>[] {HttpServletRequest.class}, (proxy, method, args) -> switch (method.getName()) {
                case "getHeader" -> "Idempotency-Key".equalsIgnoreCase((String) args[0]) ? key : null;
                case "getHeaders" -> java.util.Collections.enumeration(
                    "Idempotency-Key".equalsIgnoreCase((String) args[0]) ? keys : List.of());
                case "getMethod" -> "POST";
                case "setAttribute" -> attributes.put((String) args[0], args[1]);
                case "getAttribute" -> attributes.get((String) args[0]);
                case "getInputStream" -> IdempotencyFilter.inputStream(body);
                default -> throw new UnsupportedOperationException(method.getName());
            });
    }

    /** What a response of the servlet API got. */
    static final class Sent {
        int status;
        final List<List<String>> headers = new ArrayList<>();
        final ByteArrayOutputStream body = new ByteArrayOutputStream();

        HttpServletResponse proxy() {
            return (HttpServletResponse) Proxy.newProxyInstance(IdempotencyTest.class.getClassLoader(),
                new Class<?>[] {HttpServletResponse.class}, (p, method, args) -> switch (method.getName()) {
                    case "setStatus" -> {
                        status = (Integer) args[0];
                        yield null;
                    }
                    case "addHeader" -> headers.add(List.of((String) args[0], (String) args[1]));
                    case "setContentLength" -> null;
                    case "getOutputStream" -> new ServletOutputStream() {
                        @Override
                        public void write(int b) {
                            body.write(b);
                        }

                        @Override
                        public boolean isReady() {
                            return true;
                        }

                        @Override
                        public void setWriteListener(WriteListener l) {
                        }
                    };
                    default -> throw new UnsupportedOperationException(method.getName());
                });
        }
    }

    static void filter(Idempotency idem) throws Exception {
        AtomicInteger runs = new AtomicInteger();
        IdempotencyFilter filter = new IdempotencyFilter(idem, op("filter"));
        FilterChain chain = (req, res) -> {
            runs.incrementAndGet();
            HttpServletRequest r = (HttpServletRequest) req;
            HttpServletResponse out = (HttpServletResponse) res;
            String body = new String(r.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
            Connection conn = (Connection) r.getAttribute(IdempotencyFilter.CONNECTION);
            if (body.contains("crash") || conn == null) {
                out.sendError(500);
                return;
            }
            out.setStatus(201);
            out.setContentType("application/json");
            out.addHeader("X-Tag", "a");
            out.addHeader("X-Tag", "b");
            out.getWriter().print("{\"echo\":" + body + "}");
        };
        String key = UUID.randomUUID().toString();
        Sent first = new Sent();
        filter.doFilter(request(key, "{\"n\":1}"), first.proxy(), chain);
        Sent again = new Sent();
        filter.doFilter(request(key, "{\"n\":1}"), again.proxy(), chain);
        check("filter: the chain runs once, on the claim's connection, and its answer is stored",
              first.status == 201 && runs.get() == 1 && first.body.toString().equals("{\"echo\":{\"n\":1}}")
              && first.headers.size() == 3, first.headers);
        check("filter: a retry replays it with Idempotent-Replayed",
              again.status == 201 && Arrays.equals(again.body.toByteArray(), first.body.toByteArray())
              && again.headers.get(3).equals(List.of("Idempotent-Replayed", "true")), again.headers);
        Sent other = new Sent();
        filter.doFilter(request(key, "{\"n\":2}"), other.proxy(), chain);
        check("filter: another request with the key is 422", other.status == 422, other.status);
        String crash = UUID.randomUUID().toString();
        filter.doFilter(request(crash, "{\"crash\":1}"), new Sent().proxy(), chain);
        Sent crashed = new Sent();
        filter.doFilter(request(crash, "{\"crash\":1}"), crashed.proxy(), chain);
        check("filter: a 5xx is not stored: the retry runs again", crashed.status == 500 && runs.get() == 3, runs);
        // A body that is not UTF-8 is the client's bad request: decoded
        // with U+FFFD, two different bodies would be one request.
        String utf = UUID.randomUUID().toString();
        int before = runs.get();
        Sent bad = new Sent();
        filter.doFilter(request(utf, new byte[] {'{', '"', 'n', '"', ':', '"', (byte) 0xff, '"', '}'}), bad.proxy(), chain);
        Sent bad2 = new Sent();
        filter.doFilter(request(utf, new byte[] {'{', '"', 'n', '"', ':', '"', (byte) 0xfe, '"', '}'}), bad2.proxy(), chain);
        check("filter: a body that is not UTF-8 is 400 INVALID_JSON, and the chain does not run",
              bad.status == 400 && bad2.status == 400 && runs.get() == before
              && new String(bad2.body.toByteArray(), StandardCharsets.UTF_8).contains("\"INVALID_JSON\""),
              bad.status + " " + bad2.status + " " + bad2.body);
        Sent good = new Sent();
        filter.doFilter(request(utf, "{\"n\":\"x\"}"), good.proxy(), chain);
        check("  ... and nothing is stored: the key then proceeds", good.status == 201 && runs.get() == before + 1,
              good.status);
    }

    /**
     * Forwards connections to the server, counting round trips: one each
     * time the client sends after the server did.  hold() holds back the
     * next COMMIT (a simple query or a statement parsed alone) until
     * release.
     */
    static final class Tap implements AutoCloseable {
        final ServerSocket listener;
        private int trips;
        private boolean serverSpoke;
        private CountDownLatch held;
        private CountDownLatch release;

        Tap(String host, int port) throws IOException {
            listener = new ServerSocket(0, 50, InetAddress.getByName("127.0.0.1"));
            daemon(() -> {
                while (true) {
                    Socket client;
                    Socket server;
                    try {
                        client = listener.accept();
                    } catch (IOException e) {
                        return;
                    }
                    try {
                        server = new Socket(host, port);
                    } catch (IOException e) {
                        close(client);
                        continue;
                    }
                    daemon(() -> fromServer(server, client));
                    daemon(() -> fromClient(client, server));
                }
            });
        }

        static void daemon(Runnable r) {
            Thread t = new Thread(r, "tap");
            t.setDaemon(true);
            t.start();
        }

        static void close(Socket... sockets) {
            for (Socket s : sockets) {
                try {
                    s.close();
                } catch (IOException e) {
                    // closing
                }
            }
        }

        synchronized int trips() {
            return trips;
        }

        synchronized CountDownLatch[] hold() {
            held = new CountDownLatch(1);
            release = new CountDownLatch(1);
            return new CountDownLatch[] {held, release};
        }

        void fromServer(Socket server, Socket client) {
            try {
                InputStream in = server.getInputStream();
                OutputStream out = client.getOutputStream();
                byte[] buf = new byte[32 << 10];
                for (int n; (n = in.read(buf)) > 0;) {
                    synchronized (this) {
                        serverSpoke = true;
                    }
                    out.write(buf, 0, n);
                }
            } catch (IOException e) {
                // a side closed
            } finally {
                close(server, client);
            }
        }

        /** The client's messages one by one: the startup message (and an SSL or GSS request before it) has no type byte. */
        void fromClient(Socket client, Socket server) {
            try {
                DataInputStream in = new DataInputStream(client.getInputStream());
                OutputStream out = server.getOutputStream();
                boolean typed = false;
                Map<String, String> named = new HashMap<>();
                while (true) {
                    int type = typed ? in.readUnsignedByte() : -1;
                    int length = in.readInt();
                    byte[] body = new byte[length - 4];
                    in.readFully(body);
                    if (!typed) {
                        int code = ByteBuffer.wrap(body).getInt();
                        typed = code != 80877103 && code != 80877104;
                    } else if (isCommit(type, body, named)) {
                        CountDownLatch h;
                        CountDownLatch r;
                        synchronized (this) {
                            h = held;
                            r = release;
                            held = null;
                        }
                        if (h != null) {
                            h.countDown();
                            r.await();
                        }
                    }
                    synchronized (this) {
                        if (serverSpoke) {
                            trips++;
                            serverSpoke = false;
                        }
                    }
                    ByteBuffer msg = ByteBuffer.allocate(length + (type < 0 ? 0 : 1));
                    if (type >= 0) {
                        msg.put((byte) type);
                    }
                    out.write(msg.putInt(length).put(body).array());
                }
            } catch (IOException | InterruptedException e) {
                // a side closed
            } finally {
                close(client, server);
            }
        }

        /** A COMMIT: a simple query, a statement parsed without a name, or a named one bound. */
        static boolean isCommit(int type, byte[] body, Map<String, String> named) {
            String[] strings = new String(body, StandardCharsets.UTF_8).split("\0", 3);
            switch (type) {
                case 'Q':
                    return strings[0].equals("COMMIT");
                case 'P': // the statement's name, then its text
                    if (!strings[0].isEmpty()) {
                        named.put(strings[0], strings[1]);
                    }
                    return strings[0].isEmpty() && strings[1].equals("COMMIT");
                case 'B': // the portal, then the statement's name
                    return "COMMIT".equals(named.get(strings[1]));
                default:
                    return false;
            }
        }

        @Override
        public void close() throws IOException {
            listener.close();
        }
    }

    /** A pool's connections, counting those taken and not yet given back. */
    static final class Counted implements Idempotency.Connections {
        final Pool pool;
        final AtomicInteger out = new AtomicInteger();

        Counted(Pool pool) {
            this.pool = pool;
        }

        @Override
        public Connection take() throws SQLException {
            Connection conn = pool.take();
            out.incrementAndGet();
            return conn;
        }

        @Override
        public void give(Connection conn, boolean broken) {
            pool.give(conn, broken);
            out.decrementAndGet();
        }

        /** Waits until every connection is back, 20 s at most. */
        boolean idle() {
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
            while (out.get() != 0 && System.nanoTime() < deadline) {
                sleep(1);
            }
            return out.get() == 0;
        }
    }

    /** A pool of one connection through a tap, with more driver properties. */
    static Pool tapped(Tap tap, String... more) {
        Properties props = new Properties();
        props.setProperty("user", System.getenv().getOrDefault("PGUSER", System.getProperty("user.name")));
        props.setProperty("sslmode", "disable");
        for (int i = 0; i + 1 < more.length; i += 2) {
            props.setProperty(more[i], more[i + 1]);
        }
        String db = System.getenv().getOrDefault("PGDATABASE", props.getProperty("user"));
        return new Pool("jdbc:postgresql://127.0.0.1:" + tap.listener.getLocalPort() + "/" + db, props, 1);
    }

    /**
     * Round trips through a tap, with named statements once a statement ran
     * five times (the driver's default) and with none (prepareThreshold=0,
     * for a pooler in transaction mode).
     */
    static void roundTrips(String name, String... more) throws Exception {
        String host = System.getenv().getOrDefault("PGHOST", "localhost");
        int port = Integer.parseInt(System.getenv().getOrDefault("PGPORT", "5432"));
        try (Tap tap = new Tap(host, port); Pool pool = tapped(tap, more)) {
            Counted conns = new Counted(pool);
            Idempotency idem = new Idempotency(conns);
            String op = op("trips." + name);
            for (int i = 0; i < 6; i++) { // the driver prepares a statement at its fifth run
                Call c = Call.of(op, UUID.randomUUID().toString(), "{\"amount\": 20}");
                idem.run(c, (conn, a) -> pay(conn, a, 20));
                idem.run(c, NEVER);
                conns.idle();
            }
            Call c = Call.of(op, UUID.randomUUID().toString(), "{\"amount\": 20}");
            int before = tap.trips();
            Response first = idem.run(c, (conn, a) -> pay(conn, a, 20));
            int n = tap.trips() - before;
            check(name + ": a new key is three round trips", first.status() == 201 && n == 3, n);

            CountDownLatch[] hold = tap.hold();
            before = tap.trips();
            CompletableFuture<Response> replay = CompletableFuture.supplyAsync(() -> {
                try {
                    return idem.run(c, NEVER);
                } catch (Exception e) {
                    throw new RuntimeException(e);
                }
            });
            Response again;
            try {
                again = replay.get(20, TimeUnit.SECONDS);
            } catch (TimeoutException e) {
                hold[1].countDown();
                again = null;
            }
            n = tap.trips() - before;
            check(name + ": a replay is answered after one round trip, before its COMMIT",
                  again != null && again.replayed() && n == 1, n + " " + again);
            boolean held = hold[0].await(20, TimeUnit.SECONDS);
            check(name + "  ... which follows it; the connection is given back after it",
                  held && conns.out.get() == 1, held + " " + conns.out.get());
            hold[1].countDown();
            check(name + "  ... and is given back", conns.idle() && tap.trips() - before == 2, tap.trips() - before);
        }
    }

    /**
     * A claim that finds an ended lease writes the record unknown: that
     * answer waits for its COMMIT, and the connection is back when it is
     * returned.
     */
    static void unknownCommitsFirst(Pool direct) throws Exception {
        String host = System.getenv().getOrDefault("PGHOST", "localhost");
        int port = Integer.parseInt(System.getenv().getOrDefault("PGPORT", "5432"));
        String key = UUID.randomUUID().toString();
        Call c = Call.of(op("unknown"), key, "{}");
        Connection conn = direct.take();
        try (PreparedStatement ps = conn.prepareStatement(
                "SELECT outcome FROM idem_claim(?, ?, '{}', lease => '1 millisecond'), pg_sleep(0.01)")) {
            ps.setString(1, c.operation());
            ps.setString(2, key);
            ps.executeQuery().close();
            conn.commit(); // a lease of 1 ms, over once 10 ms have passed
        } finally {
            direct.give(conn, false);
        }
        try (Tap tap = new Tap(host, port); Pool pool = tapped(tap)) {
            Counted conns = new Counted(pool);
            Idempotency idem = new Idempotency(conns);
            CountDownLatch[] hold = tap.hold();
            CompletableFuture<Object[]> run = CompletableFuture.supplyAsync(() -> {
                try {
                    Response r = idem.run(c, NEVER);
                    return new Object[] {r, conns.out.get()};
                } catch (Exception e) {
                    throw new RuntimeException(e);
                }
            });
            boolean held = hold[0].await(20, TimeUnit.SECONDS);
            hold[1].countDown();
            Object[] got = run.get(30, TimeUnit.SECONDS);
            check("unknown: the answer waits for the COMMIT of the claim that wrote it",
                  held && "unknown".equals(((Response) got[0]).outcome()) && (Integer) got[1] == 0,
                  held + " " + got[0] + " " + got[1]);
            Response next = idem.run(c, NEVER);
            check("  ... and the next claim finds it unknown", "unknown".equals(next.outcome()), next);
        }
    }

    /** Pool.fromEnvironment with more of the driver's properties. */
    static void driverProperties() throws Exception {
        Properties more = new Properties();
        more.setProperty("prepareThreshold", "0");
        try (Pool pool = Pool.fromEnvironment(1, "idempotency-test-java", more)) {
            Connection conn = pool.take();
            int threshold = conn.unwrap(org.postgresql.PGConnection.class).getPrepareThreshold();
            pool.give(conn, false);
            check("Pool.fromEnvironment passes more properties to the driver (prepareThreshold=0)",
                  threshold == 0, threshold);
        }
    }

    /** Nesting beyond Json.MAX_NESTING: a 400 before any parser, and the parser refuses it too (no StackOverflowError). */
    static void nesting() {
        String deep = "[".repeat(100_000) + "]".repeat(100_000);
        try {
            Json.parse(deep);
            check("Json.parse refuses nesting beyond MAX_NESTING", false, "parsed");
        } catch (IllegalArgumentException e) {
            check("Json.parse refuses nesting beyond MAX_NESTING", true, e);
        }
        String limit = "[".repeat(Json.MAX_NESTING) + "\"[[[\"" + "]".repeat(Json.MAX_NESTING);
        check("Json.parse takes nesting to MAX_NESTING (brackets in strings not counted)",
              Json.parse(limit) instanceof List && !Json.tooDeep(limit, Json.MAX_NESTING), limit.length());
        try {
            Idempotency.bodyText(deep.getBytes(StandardCharsets.UTF_8));
            check("bodyText: nesting beyond MAX_NESTING is 400 JSON_TOO_DEEP", false, "accepted");
        } catch (Idempotency.HttpError e) {
            check("bodyText: nesting beyond MAX_NESTING is 400 JSON_TOO_DEEP",
                  e.status == 400 && e.errorCode.equals("JSON_TOO_DEEP"), e.errorCode);
        }
    }

    /**
     * clients/conformance.json, the answers every library gives the same:
     * each decision row's HTTP answer, each SQLSTATE's kind, each header
     * pair a handler may return.  (Its hostile rows run end to end against
     * the example: examples/python/test_payments_service.py.)
     */
    @SuppressWarnings("unchecked")
    static void conformance() throws Exception {
        Map<String, Object> fixture = Json.object(new String(
            java.nio.file.Files.readAllBytes(java.nio.file.Path.of("..", "conformance.json")), StandardCharsets.UTF_8));
        for (Object o : (List<Object>) ((Map<String, Object>) fixture.get("decisions")).get("rows")) {
            Map<String, Object> row = (Map<String, Object>) o;
            Map<String, Object> d = (Map<String, Object>) row.get("row");
            Response r = Idempotency.answer((String) d.get("outcome"), number(d.get("http_status")),
                d.get("headers") == null ? null : Json.write(d.get("headers")), (String) d.get("body_text"), (String) d.get("error_code"),
                number(d.get("retry_after")), unhex((String) d.get("raw_body_hex")));
            byte[] body = row.containsKey("body_hex") ? unhex((String) row.get("body_hex"))
                : ((String) row.get("body_text")).getBytes(StandardCharsets.UTF_8);
            check("conformance: decision: " + row.get("name"),
                  r.status() == number(row.get("status")) && r.headers().equals(row.get("headers"))
                  && Arrays.equals(r.body(), body), r.status() + " " + r.headers() + " " + new String(r.body(), StandardCharsets.UTF_8));
        }
        Map<String, String> kinds = Map.of("IDEMPOTENCY_KEY_INVALID", "key_invalid", "INVALID_REQUEST", "request_invalid");
        Map<String, Object> codes = (Map<String, Object>) ((Map<String, Object>) fixture.get("sqlstates")).get("codes");
        for (Map.Entry<String, Object> e : codes.entrySet()) {
            Response r = Idempotency.refusal(e.getKey(), "refused");
            String kind = r == null ? "error" : r.status() == 400 ? kinds.get(code(r)) : "status " + r.status();
            check("conformance: SQLSTATE " + e.getKey() + " is " + e.getValue(), e.getValue().equals(kind), kind);
        }
        for (Object o : (List<Object>) ((Map<String, Object>) fixture.get("header_values")).get("rows")) {
            Map<String, Object> row = (Map<String, Object>) o;
            List<String> pair = List.of((String) row.get("name"), (String) row.get("value"));
            boolean stored;
            try {
                stored = Result.of(200, List.of(pair), null).headers().equals(List.of(pair));
            } catch (IllegalArgumentException e) {
                stored = false;
            }
            check("conformance: header " + Json.write(pair) + (Boolean.TRUE.equals(row.get("valid")) ? " is stored" : " is refused"),
                  stored == Boolean.TRUE.equals(row.get("valid")), stored);
        }
        check("conformance: the nesting limit is the fixture's",
              number(fixture.get("nesting_limit")) == Json.MAX_NESTING, fixture.get("nesting_limit"));
    }

    /**
     * The fixture's hostile rows through the Filter, in a servlet container
     * that keeps header values as sent (ISO-8859-1 chars of their bytes):
     * a chain that pays, behind the example's check (a JSON object).
     */
    @SuppressWarnings("unchecked")
    static void filterHostile(Pool pool, Idempotency idem) throws Exception {
        Map<String, Object> fixture = Json.object(new String(
            java.nio.file.Files.readAllBytes(java.nio.file.Path.of("..", "conformance.json")), StandardCharsets.UTF_8));
        int limit = number(fixture.get("nesting_limit"));
        IdempotencyFilter filter = new IdempotencyFilter(idem, op("hostile"), (request, body) -> {
            Object v;
            try {
                v = body.isEmpty() ? null : Json.parse(body);
            } catch (IllegalArgumentException e) {
                v = null;
            }
            if (!(v instanceof Map)) {
                throw new Idempotency.HttpError(400, "INVALID_JSON", "the body must be a JSON object");
            }
        });
        FilterChain chain = (req, res) -> {
            HttpServletRequest r = (HttpServletRequest) req;
            Idempotency.Attempt a = (Idempotency.Attempt) r.getAttribute(IdempotencyFilter.ATTEMPT);
            try {
                Result paid = pay((Connection) r.getAttribute(IdempotencyFilter.CONNECTION), a, 100);
                HttpServletResponse out = (HttpServletResponse) res;
                out.setStatus(paid.status());
                out.getOutputStream().write(paid.body());
            } catch (Exception e) {
                throw new javax.servlet.ServletException(e);
            }
        };
        byte[] good = "{\"amount\": 100, \"currency\": \"EUR\"}".getBytes(StandardCharsets.UTF_8);
        List<Object> rows = (List<Object>) ((Map<String, Object>) fixture.get("hostile")).get("rows");
        String key = null;
        for (int i = 0; i < rows.size(); i++) {
            Map<String, Object> row = (Map<String, Object>) rows.get(i);
            if (!Boolean.TRUE.equals(row.get("same_key_as_previous"))) {
                key = UUID.randomUUID().toString();
            }
            List<String> keys;
            if (row.containsKey("key_hex")) {
                keys = List.of(new String(unhex((String) row.get("key_hex")), StandardCharsets.ISO_8859_1));
            } else if (row.containsKey("keys")) {
                String k = key;
                keys = ((List<Object>) row.get("keys")).stream().map(o -> ((String) o).replace("{key}", k)).toList();
            } else if (row.containsKey("key_suffix_hex")) {
                keys = List.of(key + new String(unhex((String) row.get("key_suffix_hex")), StandardCharsets.ISO_8859_1));
            } else {
                keys = List.of(key);
            }
            byte[] body;
            if (row.containsKey("body_hex")) {
                body = unhex((String) row.get("body_hex"));
            } else if (row.containsKey("body_text")) {
                body = ((String) row.get("body_text")).getBytes(StandardCharsets.UTF_8);
            } else if (row.containsKey("body_nesting")) {
                int n = number(row.get("body_nesting")) - 1;
                body = ("{\"amount\": 100, \"currency\": \"EUR\", \"s\": \"" + "[".repeat(600) + "\", \"n\": "
                        + "[".repeat(n) + "]".repeat(n) + "}").getBytes(StandardCharsets.UTF_8);
            } else {
                body = good;
            }
            Sent sent = new Sent();
            filter.doFilter(request(keys, body), sent.proxy(), chain);
            String errorCode = null;
            try {
                errorCode = (String) Json.object(sent.body.toString(StandardCharsets.UTF_8)).get("error_code");
            } catch (IllegalArgumentException e) {
                // not an error body
            }
            Object want = row.get("error_code");
            check("filter, hostile: " + row.get("name") + " -> " + row.get("status") + " " + want,
                  sent.status == number(row.get("status")) && (want == null || want.equals(errorCode)),
                  sent.status + " " + sent.body);
            boolean last = i + 1 == rows.size()
                || !Boolean.TRUE.equals(((Map<String, Object>) rows.get(i + 1)).get("same_key_as_previous"));
            if (Boolean.FALSE.equals(row.get("stored")) && last && !row.containsKey("key_hex")) {
                Sent again = new Sent();
                filter.doFilter(request(key, good), again.proxy(), chain);
                check("  ... nothing was stored: the key with a good body then proceeds",
                      again.status == 201 && payments(pool, key) == 1, again.status + " " + again.headers);
            }
        }
        check("filter, hostile: the nesting limit is checked", limit == Json.MAX_NESTING, limit);
    }

    static Integer number(Object v) {
        return v == null ? null : ((Json.Number) v).asLong().intValue();
    }

    static byte[] unhex(String h) {
        if (h == null) {
            return null;
        }
        byte[] b = new byte[h.length() / 2];
        for (int k = 0; k < b.length; k++) {
            b[k] = (byte) Integer.parseInt(h.substring(2 * k, 2 * k + 2), 16);
        }
        return b;
    }

    static final Idempotency.Handler CREATED = (conn, a) -> Result.json(201, Map.of("ok", true));

    /**
     * A superuser's pool (IDEM_ADMIN_DSN, in libpq's key=value form), acting
     * as role unless it is null; null without IDEM_ADMIN_DSN.
     */
    static Pool admin(String role) {
        String dsn = System.getenv("IDEM_ADMIN_DSN");
        if (dsn == null || dsn.isBlank()) {
            return null;
        }
        Map<String, String> kv = new HashMap<>();
        for (String part : dsn.trim().split("\\s+")) {
            int eq = part.indexOf('=');
            kv.put(part.substring(0, eq), part.substring(eq + 1));
        }
        Properties props = new Properties();
        props.setProperty("user", kv.getOrDefault("user", "postgres"));
        props.setProperty("sslmode", "disable");
        if (role != null) {
            props.setProperty("options", "-c role=" + role);
        }
        return new Pool("jdbc:postgresql://" + kv.getOrDefault("host", "localhost") + ":"
                        + kv.getOrDefault("port", "5432") + "/" + kv.get("dbname"), props, 2);
    }

    /** A statement in a transaction of its own. */
    static void execute(Pool pool, String sql) throws SQLException {
        Connection conn = pool.take();
        try (Statement st = conn.createStatement()) {
            st.execute(sql);
            conn.commit();
        } finally {
            conn.rollback();
            pool.give(conn, false);
        }
    }

    /** The SQLSTATE a call raises, or "none". */
    static String raises(java.util.concurrent.Callable<?> call) throws Exception {
        try {
            call.call();
            return "none";
        } catch (SQLException e) {
            return e.getSQLState() + " " + e.getMessage();
        }
    }

    /**
     * A call with no option but the tenant goes to idem_claim_text: a role
     * that may execute it and not idem_claim proceeds and replays; the same
     * key through idem_claim answers alike (the same fingerprint).  Then,
     * with EXECUTE on idem_claim_text revoked after the first call found it
     * usable, the claim it refuses goes to idem_claim, as every later one.
     */
    static void claimText() throws Exception {
        Pool admin = admin(null);
        if (admin == null) {
            System.out.println("skip   idem_claim_text: no IDEM_ADMIN_DSN");
            return;
        }
        String role = "idem_java_text_" + RUN;
        try (admin) {
            execute(admin, "CREATE ROLE " + role);
            execute(admin, "GRANT EXECUTE ON FUNCTION idem_claim_text, idem_complete, idem_fail TO " + role);
            try (Pool as = admin(role)) {
                Idempotency idem = new Idempotency(as);
                Call c = Call.of(op("text"), UUID.randomUUID().toString(),
                                 "{\"amount\": 19, \"note\": \"a \\\"b\\\" \\\\ \u00e9\"}").withTenant("tenant \\ 't'");
                Response first = idem.run(c, CREATED);
                check("idem_claim_text: a call with no option but the tenant proceeds where only idem_claim_text may run",
                      first.status() == 201 && Boolean.TRUE.equals(idem.claimText()), first + " " + idem.claimText());
                Response again = idem.run(c, NEVER);
                check("  ... and its retry replays", again.replayed() && Arrays.equals(again.body(), first.body()), again);
                String state = raises(() -> idem.run(c.withWait(Duration.ZERO), NEVER));
                check("  ... a call with another option goes to idem_claim (which the role may not run: 42501)",
                      state.startsWith("42501 "), state);
                execute(admin, "GRANT EXECUTE ON FUNCTION idem_claim TO " + role);
                Call reordered = new Call(c.operation(), c.key(), "{\"note\":\"a \\\"b\\\" \\\\ \u00e9\",\"amount\":19.0}",
                                          c.tenant(), null, Duration.ZERO, null);
                Response through = idem.run(reordered, NEVER);
                check("  ... idem_claim answers idem_claim_text's record alike (the same fingerprint)",
                      through.replayed() && Arrays.equals(through.body(), first.body()), through);
                Call other = new Call(c.operation(), c.key(), "{\"amount\": 20}", c.tenant(), null, null, null);
                check("  ... another request is a mismatch through both",
                      idem.run(other, NEVER).status() == 422 && idem.run(other.withWait(Duration.ZERO), NEVER).status() == 422,
                      "");

                Idempotency revoked = new Idempotency(as);
                Response before = revoked.run(Call.of(op("revoked"), UUID.randomUUID().toString(), "{}"), CREATED);
                boolean found = Boolean.TRUE.equals(revoked.claimText());
                execute(admin, "REVOKE EXECUTE ON FUNCTION idem_claim_text FROM " + role);
                Call after = Call.of(op("revoked"), UUID.randomUUID().toString(), "{}");
                Response r = revoked.run(after, CREATED);
                check("idem_claim_text revoked after the first call found it: the claim goes to idem_claim",
                      found && before.status() == 201 && r.status() == 201 && Boolean.FALSE.equals(revoked.claimText()),
                      before + " " + r + " " + revoked.claimText());
                check("  ... and its retry replays", revoked.run(after, NEVER).replayed(), "");
            } finally {
                execute(admin, "DROP OWNED BY " + role + "; DROP ROLE " + role);
            }
        }
    }

    /**
     * The schema option qualifies every call, for a search_path without the
     * extension's schema; a schema without idem_claim_text (an extension
     * before 1.2: here, pg_catalog) sends the claims to idem_claim.
     */
    static void schema() throws Exception {
        Properties more = new Properties();
        more.setProperty("options", "-c search_path=pg_catalog");
        try (Pool off = Pool.fromEnvironment(2, "idempotency-test-java-schema", more)) {
            String key = UUID.randomUUID().toString();
            Idempotency plain = new Idempotency(off);
            String state = raises(() -> plain.run(Call.of(op("schema"), key, "{}"), NEVER));
            check("schema: without it, off the search_path, the claim is not found (42883)",
                  state.startsWith("42883 ") && Boolean.FALSE.equals(plain.claimText()), state);
            Idempotency idem = new Idempotency(off, "public");
            Call c = Call.of(op("schema"), key, "{\"amount\": 2}");
            Response first = idem.run(c, CREATED);
            check("schema \"public\": the claim proceeds, through idem_claim_text",
                  first.status() == 201 && Boolean.TRUE.equals(idem.claimText()), first + " " + idem.claimText());
            check("  ... and replays", idem.run(c, NEVER).replayed(), "");
            Call ext = Call.of(op("schema.external"), UUID.randomUUID().toString(), "{}").withLease(Duration.ofMinutes(1));
            Response charged = idem.runExternal(ext, e -> {
                e.checkpoint("charged");
                return Result.json(201, Map.of("derived", e.deriveKey("charge")));
            });
            check("  ... the external-call form: checkpoint, derived key, completion",
                  charged.status() == 201 && charged.body().length == "{\"derived\":\"\"}".length() + 36, charged);
            Response replayed = idem.runExternal(ext, e -> null);
            check("  ... and its replay", replayed.replayed() && Arrays.equals(replayed.body(), charged.body()), replayed);
            Idempotency catalog = new Idempotency(off, "pg_catalog");
            state = raises(() -> catalog.run(Call.of(op("schema"), UUID.randomUUID().toString(), "{}"), NEVER));
            check("schema without idem_claim_text: the claim goes to idem_claim (there none either: 42883)",
                  state.startsWith("42883 ") && state.contains("pg_catalog.idem_claim(")
                  && Boolean.FALSE.equals(catalog.claimText()), state + " " + catalog.claimText());
            Idempotency none = new Idempotency(off, "no such schema");
            state = raises(() -> none.run(Call.of(op("schema"), UUID.randomUUID().toString(), "{}"), NEVER));
            check("a schema that does not exist: the server's 3F000", state.startsWith("3F000 "), state);
            try {
                new Idempotency(off, "bad\0name");
                check("a schema name with NUL is refused at once", false, "accepted");
            } catch (IllegalArgumentException e) {
                check("a schema name with NUL is refused at once", e.getMessage().contains("schema"), e);
            }
        }
    }

    public static void main(String[] args) throws Exception {
        Pool pool = Pool.fromEnvironment(4, "idempotency-test-java");
        Idempotency idem = new Idempotency(pool);
        try {
            core(pool, idem);
            headers(pool, idem);
            nesting();
            conformance();
            filterHostile(pool, idem);
            external(idem);
            filter(idem);
            roundTrips("named statements");
            roundTrips("prepareThreshold=0", "prepareThreshold", "0");
            unknownCommitsFirst(pool);
            driverProperties();
            claimText();
            schema();
        } catch (Exception | AssertionError e) {
            e.printStackTrace();
            check("the test ran to its end", false, e);
        } finally {
            pool.close();
        }
        System.out.println(passed + " passed, " + failed + " failed");
        System.exit(failed == 0 ? 0 : 1);
    }
}
