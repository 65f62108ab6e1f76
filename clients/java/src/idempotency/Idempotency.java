/*
 * The Idempotency-Key pattern on the idempotency PostgreSQL extension, over
 * JDBC (the PostgreSQL JDBC driver).
 *
 * run(call, handler): one transaction.  The handler runs only for a new key
 * (or a new attempt), inside the claim's transaction, on its connection;
 * the answer comes back as a Response, every outcome of idem_claim mapped as
 * the README's HTTP table says.  runExternal(call, handler): the claim
 * commits with a lease, extended while the handler calls something outside
 * the database, then the outcome commits.
 *
 * A call with no option but the tenant goes to idem_claim_text (1.2) where
 * the server offers it to the role (asked once, at the first call); else,
 * and with any other option, to idem_claim.  With a schema, every function
 * is called qualified by it, for an extension off the search_path.
 *
 * Round trips: a new key takes three (the claim, which the driver sends
 * with its BEGIN; the handler's statements; the completion and COMMIT in
 * one execute), a retry one (the claim: its answer does not wait for the
 * COMMIT behind it).
 */
package idempotency;

import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;

public final class Idempotency {
    /** Where connections come from: autocommit off, given back after each call. */
    public interface Connections {
        Connection take() throws SQLException;

        void give(Connection conn, boolean broken);
    }

    /** The answer to send: header pairs in order, repeats kept. */
    public record Response(int status, List<List<String>> headers, byte[] body, String outcome,
                           boolean replayed) {
        /** The first value of a header, or null. */
        public String header(String name) {
            for (List<String> h : headers) {
                if (h.get(0).equalsIgnoreCase(name)) {
                    return h.get(1);
                }
            }
            return null;
        }
    }

    /**
     * What a handler returns.  failed: stored with idem_fail and replayed;
     * retryable: a failure that a retry runs again.
     */
    public record Result(int status, List<List<String>> headers, byte[] body, String resourceId,
                         boolean failed, boolean retryable) {
        public Result {
            if (status < 100 || status > 599) {
                throw new IllegalArgumentException("not an HTTP status: " + status);
            }
            headers = checkedHeaders(headers);
            body = body == null ? new byte[0] : body;
        }

        public static Result of(int status, List<List<String>> headers, byte[] body) {
            return new Result(status, headers, body, null, false, false);
        }

        /** A JSON body (Json.write of value), Content-Type first, then name, value, ... */
        public static Result json(int status, Object value, String... more) {
            return of(status, jsonHeaders(more), Json.write(value).getBytes(StandardCharsets.UTF_8));
        }

        public Result withResourceId(String id) {
            return new Result(status, headers, body, id, failed, retryable);
        }

        /** Stored with idem_fail: replayed like a success. */
        public Result asFailure() {
            return new Result(status, headers, body, resourceId, true, false);
        }

        Response response() {
            return new Response(status, headers, body, "proceed", false);
        }
    }

    /** An HTTP token (RFC 9110): what a header name may be. */
    private static final java.util.regex.Pattern TOKEN = java.util.regex.Pattern.compile("[!#$%&'*+.^_`|~0-9A-Za-z-]+");

    /**
     * Why the strictest server (node:http) would refuse to send a header, or
     * null when it sends it: a name that is not a token, a value with a
     * character above U+00FF or a control character other than HTAB (CR and
     * LF would split the answer; the JDK's server writes each char as one
     * byte, so U+010D U+010A would be CR LF too).
     */
    public static String headerProblem(String name, String value) {
        if (name == null || !TOKEN.matcher(name).matches()) {
            return "invalid header name " + Json.write(name);
        }
        if (value == null) {
            return "no value for header " + Json.write(name);
        }
        for (int k = 0; k < value.length(); k++) {
            char c = value.charAt(k);
            if (c != '\t' && (c < 0x20 || c == 0x7f || c > 0xff)) {
                return "invalid character in the value of header " + Json.write(name);
            }
        }
        return null;
    }

    /** A handler's header pairs, each checked before it is stored (IllegalArgumentException). */
    static List<List<String>> checkedHeaders(List<List<String>> headers) {
        if (headers == null) {
            return List.of();
        }
        List<List<String>> pairs = new ArrayList<>(headers.size());
        for (List<String> h : headers) {
            if (h == null || h.size() != 2) {
                throw new IllegalArgumentException("a header is a [name, value] pair: " + h);
            }
            String problem = headerProblem(h.get(0), h.get(1));
            if (problem != null) {
                throw new IllegalArgumentException(problem);
            }
            pairs.add(List.of(h.get(0), h.get(1)));
        }
        return List.copyOf(pairs);
    }

    /**
     * A request body as JSON text, for an adapter that reads the body
     * itself: UTF-8, or HttpError 400 INVALID_JSON (decoded with U+FFFD in
     * place of its bad bytes, different bodies would be one request and
     * fingerprint); nested deeper than Json.MAX_NESTING, 400 JSON_TOO_DEEP.
     */
    public static String bodyText(byte[] body) throws HttpError {
        String text;
        try {
            text = StandardCharsets.UTF_8.newDecoder()
                .onMalformedInput(java.nio.charset.CodingErrorAction.REPORT)
                .onUnmappableCharacter(java.nio.charset.CodingErrorAction.REPORT)
                .decode(java.nio.ByteBuffer.wrap(body)).toString();
        } catch (java.nio.charset.CharacterCodingException e) {
            throw new HttpError(400, "INVALID_JSON", "the body is not valid JSON");
        }
        if (Json.tooDeep(text, Json.MAX_NESTING)) {
            throw new HttpError(400, "JSON_TOO_DEEP",
                                "the body nests arrays and objects more than " + Json.MAX_NESTING + " deep");
        }
        return text;
    }

    /**
     * The Idempotency-Key of a request from its header lines' values (null
     * or none: missing).  The header holds one key: two lines, or a comma
     * in the value (HTTP lets a proxy join two lines so), are HttpError 400
     * IDEMPOTENCY_KEY_INVALID.
     */
    public static String headerKey(List<String> values) throws HttpError {
        if (values == null || values.isEmpty()) {
            return null;
        }
        if (values.size() > 1 || values.get(0).contains(",")) {
            throw new HttpError(400, "IDEMPOTENCY_KEY_INVALID",
                                "send one Idempotency-Key header, holding one key (no comma)");
        }
        return values.get(0);
    }

    /** A claim that proceeds: its key, token, attempt and recovery point. */
    public record Attempt(String key, String token, int attempt, String recoveryPoint) {
    }

    /** One request: operation, key (null: missing), request as JSON text (null: none), options. */
    public record Call(String operation, String key, String request, String tenant, Duration lease,
                       Duration waitFor, String onLeaseExpiry) {
        public static Call of(String operation, String key, String request) {
            return new Call(operation, key, request, "", null, null, null);
        }

        public Call withTenant(String t) {
            return new Call(operation, key, request, t, lease, waitFor, onLeaseExpiry);
        }

        public Call withLease(Duration d) {
            return new Call(operation, key, request, tenant, d, waitFor, onLeaseExpiry);
        }

        public Call withWait(Duration d) {
            return new Call(operation, key, request, tenant, lease, d, onLeaseExpiry);
        }

        public Call withOnLeaseExpiry(String policy) {
            return new Call(operation, key, request, tenant, lease, waitFor, policy);
        }
    }

    public interface Handler {
        Result handle(Connection conn, Attempt attempt) throws Exception;
    }

    public interface ExternalHandler {
        Result handle(External external) throws Exception;
    }

    /** An answer that is not stored: thrown by a handler, the transaction rolls back. */
    public static class HttpError extends Exception {
        private static final long serialVersionUID = 1L;
        public final int status;
        public final String errorCode;

        public HttpError(int status, String errorCode, String message) {
            super(message);
            this.status = status;
            this.errorCode = errorCode;
        }

        public Response response() {
            return error(status, errorCode, getMessage());
        }
    }

    /** Thrown by an external-call handler that failed before any side effect: stored as retryable. */
    public static class RetryableException extends Exception {
        private static final long serialVersionUID = 1L;

        public RetryableException(String message) {
            super(message);
        }
    }

    /** A completion refused because the attempt lost its lease (55000): nothing was stored. */
    public static class LeaseLostException extends SQLException {
        private static final long serialVersionUID = 1L;

        LeaseLostException(SQLException cause) {
            super("the attempt lost its lease; its outcome was not stored: " + cause.getMessage(), "55000", cause);
        }
    }

    private static final Set<String> BAD_KEY = Set.of("22023", "22004");
    private static final Set<String> BAD_REQUEST = Set.of("22P02", "22P05", "22003", "22021");
    /**
     * idem_claim_text refused after the question at the first call said it
     * was usable: EXECUTE revoked (42501), or the function gone (42883).
     */
    private static final Set<String> CLAIM_TEXT_REFUSED = Set.of("42501", "42883");
    private static final Map<String, String> MESSAGES = Map.of(
        "in_progress", "a request with this Idempotency-Key is still being processed; retry after Retry-After seconds",
        "mismatch", "this Idempotency-Key was used for a different request",
        "unknown", "the outcome of an earlier attempt with this Idempotency-Key is unknown; query the resource before retrying",
        "expired", "this Idempotency-Key has expired; look the resource up by its business reference before sending the command again with a new key",
        "rate_limited", "too many new requests; send it again after Retry-After seconds, with the same Idempotency-Key");
    private static final String COLUMNS = "outcome, token, attempt, recovery_point, http_status, headers::text,"
        + " body::text, error_code, retry_after, raw_body";

    private final Connections connections;
    /** "schema". before every function, or "" (the search_path's). */
    private final String prefix;
    /**
     * Whether claims with no option but the tenant go to idem_claim_text:
     * null until the server was asked (at the first call), then true or
     * false.
     */
    private volatile Boolean claimText;
    /** Where the COMMIT behind an answer runs, and its connection is given back. */
    private final ExecutorService behind = Executors.newCachedThreadPool(r -> {
        Thread t = new Thread(r, "idempotency-commit");
        t.setDaemon(true);
        return t;
    });
    private final ScheduledExecutorService heartbeats = Executors.newSingleThreadScheduledExecutor(r -> {
        Thread t = new Thread(r, "idempotency-heartbeat");
        t.setDaemon(true);
        return t;
    });

    public Idempotency(Connections connections) {
        this(connections, null);
    }

    /**
     * schema: the extension's schema when it is not on the connections'
     * search_path (null or "": unqualified).  A name with NUL cannot be
     * sent: IllegalArgumentException.
     */
    public Idempotency(Connections connections, String schema) {
        if (schema != null && schema.indexOf('\0') >= 0) {
            throw new IllegalArgumentException("the schema " + Json.write(schema) + " cannot be a name: it contains NUL");
        }
        this.connections = connections;
        this.prefix = schema == null || schema.isEmpty() ? "" : "\"" + schema.replace("\"", "\"\"") + "\".";
    }

    /**
     * Whether a call with no option but the tenant goes to idem_claim_text:
     * null until the first call asked the server, then true or false (false
     * for good once idem_claim_text refused a claim).
     */
    public Boolean claimText() {
        return claimText;
    }

    /**
     * Ask the server, once, whether idem_claim_text is there for this role
     * (an extension before 1.2 has none; the role needs EXECUTE on it).  An
     * error leaves it unknown, asked again at the next call; the claim goes
     * to idem_claim meanwhile.
     */
    private void learnClaimText() {
        if (claimText != null) {
            return;
        }
        try {
            Connection conn = connections.take();
            boolean done = false;
            try (PreparedStatement ps = conn.prepareStatement(
                    "SELECT coalesce(has_function_privilege(to_regprocedure(?), 'EXECUTE'), false)")) {
                ps.setString(1, prefix + "idem_claim_text(text, text, text, text)");
                boolean usable;
                try (ResultSet r = ps.executeQuery()) {
                    r.next();
                    usable = r.getBoolean(1);
                }
                conn.commit();
                done = true;
                claimText = usable;
            } finally {
                release(conn, done);
            }
        } catch (SQLException e) {
            // unknown: asked again at the next call
        }
    }

    /** Whether a call goes to idem_claim_text: no option but the tenant, and the server offers it. */
    private boolean textClaim(Call c) {
        return Boolean.TRUE.equals(claimText) && c.lease() == null && c.waitFor() == null && c.onLeaseExpiry() == null;
    }

    static List<List<String>> jsonHeaders(String... more) {
        List<List<String>> headers = new ArrayList<>();
        headers.add(List.of("Content-Type", "application/json"));
        for (int i = 0; i + 1 < more.length; i += 2) {
            headers.add(List.of(more[i], more[i + 1]));
        }
        return headers;
    }

    static Response error(int status, String code, String message, String... more) {
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("error_code", code);
        body.put("message", message);
        return new Response(status, jsonHeaders(more), Json.write(body).getBytes(StandardCharsets.UTF_8),
                            null, false);
    }

    /** A row of idem_claim. */
    private record Decision(String outcome, String token, Integer attempt, String recoveryPoint,
                            Integer httpStatus, String headers, String body, String errorCode,
                            Integer retryAfter, byte[] rawBody) {
        static Decision read(PreparedStatement ps) throws SQLException {
            try (ResultSet r = ps.executeQuery()) {
                r.next();
                return new Decision(r.getString(1), r.getString(2), (Integer) r.getObject(3), r.getString(4),
                                    (Integer) r.getObject(5), r.getString(6), r.getString(7), r.getString(8),
                                    (Integer) r.getObject(9), r.getBytes(10));
            }
        }

        Attempt attemptOf(String key) {
            return new Attempt(key, token, attempt, recoveryPoint);
        }
    }

    /**
     * The HTTP answer to a row of idem_claim other than proceed, for a
     * caller that runs the claim itself: headers and body as jsonb's text,
     * rawBody the raw_body column.  IllegalStateException for a stored
     * header no server may send.
     */
    public static Response answer(String outcome, Integer httpStatus, String headers, String body,
                                  String errorCode, Integer retryAfter, byte[] rawBody) {
        return answer(new Decision(outcome, null, null, null, httpStatus, headers, body, errorCode, retryAfter,
                                   rawBody));
    }

    /** The answer to a decision other than proceed. */
    @SuppressWarnings("unchecked")
    private static Response answer(Decision d) {
        switch (d.outcome()) {
            case "replay": {
                List<List<String>> headers = new ArrayList<>();
                Object stored = d.headers() == null ? null : Json.parse(d.headers());
                if (stored instanceof List) {
                    for (Object pair : (List<Object>) stored) {
                        List<Object> p = (List<Object>) pair;
                        headers.add(List.of((String) p.get(0), (String) p.get(1)));
                    }
                } else if (stored instanceof Map) {
                    for (Map.Entry<String, Object> e : ((Map<String, Object>) stored).entrySet()) {
                        headers.add(List.of(e.getKey(), (String) e.getValue()));
                    }
                }
                // Stored by another client of the records: a header no
                // server may send is never sent (the caller answers 500).
                for (List<String> h : headers) {
                    String problem = headerProblem(h.get(0), h.get(1));
                    if (problem != null) {
                        throw new IllegalStateException("the stored answer cannot be replayed: " + problem);
                    }
                }
                headers.add(List.of("Idempotent-Replayed", "true"));
                byte[] body = d.rawBody() != null ? d.rawBody()
                    : d.body() != null ? Json.compact(d.body()).getBytes(StandardCharsets.UTF_8) : new byte[0];
                return new Response(d.httpStatus(), headers, body, "replay", true);
            }
            case "in_progress":
            case "rate_limited": {
                Response r = error(d.httpStatus(), d.errorCode(), MESSAGES.get(d.outcome()),
                                   "Retry-After", String.valueOf(d.retryAfter()));
                return new Response(r.status(), r.headers(), r.body(), d.outcome(), false);
            }
            case "mismatch":
            case "unknown":
            case "expired": {
                Response r = error(d.httpStatus(), d.errorCode(), MESSAGES.get(d.outcome()));
                return new Response(r.status(), r.headers(), r.body(), d.outcome(), false);
            }
            default:
                throw new IllegalStateException("unexpected outcome of idem_claim: " + d.outcome());
        }
    }

    /** The 400 answer to a claim that raised for the client's input, or null. */
    private static Response refuse(SQLException e) {
        String message = e.getMessage() == null ? "" : e.getMessage().lines().findFirst().orElse("");
        message = message.startsWith("ERROR: ") ? message.substring(7) : message;
        return refusal(e.getSQLState(), message);
    }

    /**
     * The 400 answer to an error of the claim with this SQLSTATE when it is
     * the client's input (a bad key, a request jsonb refuses), or null: an
     * error that is not.
     */
    public static Response refusal(String sqlState, String message) {
        if (BAD_KEY.contains(sqlState)) {
            return error(400, "IDEMPOTENCY_KEY_INVALID", message);
        }
        if (BAD_REQUEST.contains(sqlState)) {
            return error(400, "INVALID_REQUEST", message);
        }
        return null;
    }

    private static String interval(Duration d) {
        return d.toMillis() + " milliseconds";
    }

    /** The claim's statement: idem_claim_text when text, else idem_claim with the call's options. */
    private PreparedStatement claim(Connection conn, Call c, boolean text) throws SQLException {
        if (text) {
            PreparedStatement ps = conn.prepareStatement(
                "SELECT " + COLUMNS + " FROM " + prefix + "idem_claim_text(?, ?, ?, ?)");
            ps.setString(1, c.operation());
            ps.setString(2, c.key());
            ps.setString(3, c.request());
            ps.setString(4, c.tenant() == null ? "" : c.tenant());
            return ps;
        }
        List<Object> args = new ArrayList<>(List.of(c.operation(), c.key()));
        StringBuilder sql = new StringBuilder("SELECT " + COLUMNS + " FROM " + prefix + "idem_claim(?, ?, ?::jsonb, tenant => ?");
        if (c.lease() != null) {
            sql.append(", lease => ?::interval");
        }
        if (c.waitFor() != null) {
            sql.append(", wait => ?::interval");
        }
        if (c.onLeaseExpiry() != null) {
            sql.append(", on_lease_expiry => ?");
        }
        PreparedStatement ps = conn.prepareStatement(sql.append(")").toString());
        int i = 1;
        for (Object a : args) {
            ps.setObject(i++, a);
        }
        ps.setString(i++, c.request());
        ps.setString(i++, c.tenant() == null ? "" : c.tenant());
        if (c.lease() != null) {
            ps.setString(i++, interval(c.lease()));
        }
        if (c.waitFor() != null) {
            ps.setString(i++, interval(c.waitFor()));
        }
        if (c.onLeaseExpiry() != null) {
            ps.setString(i, c.onLeaseExpiry());
        }
        return ps;
    }

    /** idem_complete or idem_fail of a result, and what follows it in the same execute. */
    private PreparedStatement finish(Connection conn, String token, Result r, String then)
            throws SQLException {
        PreparedStatement ps = conn.prepareStatement(r.failed()
            ? "SELECT " + prefix + "idem_fail(?, ?, headers => ?::jsonb, raw_body => ?, retryable => ?)" + then
            : "SELECT " + prefix + "idem_complete(?, ?, headers => ?::jsonb, raw_body => ?, resource_id => ?)" + then);
        ps.setString(1, token);
        ps.setInt(2, r.status());
        ps.setString(3, Json.write(r.headers()));
        ps.setBytes(4, r.body());
        if (r.failed()) {
            ps.setBoolean(5, r.retryable());
        } else {
            ps.setString(5, r.resourceId());
        }
        return ps;
    }

    /**
     * One transaction.  When the handler throws, everything rolls back and
     * the exception goes on (an HttpError is the caller's to answer): a
     * retry proceeds.
     *
     * A claim that idem_claim_text refuses although the server offered it
     * at the first call (EXECUTE revoked since, the function gone) wrote
     * nothing: it is rolled back and sent to idem_claim, as every later one
     * is.
     *
     * An answer other than proceed is returned as soon as the claim's row
     * arrives: the claim's transaction commits behind it, on another
     * thread, and its connection is given back only once that COMMIT is
     * through (as broken when it failed), so that no later call gets a
     * connection with a transaction still open.  Only unknown waits for its
     * COMMIT: that claim may itself have written the record unknown (it
     * found an ended lease), and an answer is not sent before the write it
     * reports is committed.
     */
    public Response run(Call call, Handler handler) throws Exception {
        if (call.key() == null) {
            return error(400, "IDEMPOTENCY_KEY_MISSING", "the Idempotency-Key header is required");
        }
        learnClaimText();
        Connection conn = connections.take();
        boolean done = false;
        boolean handedOver = false;
        try {
            Decision d = null;
            while (d == null) {
                boolean text = textClaim(call);
                try (PreparedStatement ps = claim(conn, call, text)) {
                    d = Decision.read(ps);
                } catch (SQLException e) {
                    if (text && CLAIM_TEXT_REFUSED.contains(e.getSQLState())) {
                        claimText = false;
                        conn.rollback();
                        continue;
                    }
                    Response r = refuse(e);
                    if (r == null) {
                        throw e;
                    }
                    return r;
                }
            }
            if (d.outcome().equals("unknown")) {
                conn.commit();
                done = true;
                return answer(d);
            }
            if (!d.outcome().equals("proceed")) {
                Response r = answer(d);
                Connection claimed = conn;
                behind.execute(() -> {
                    boolean committed = false;
                    try {
                        claimed.commit();
                        committed = true;
                    } catch (SQLException e) {
                        // rolled back when given back, closed when that fails too
                    } finally {
                        release(claimed, committed);
                    }
                });
                handedOver = true;
                return r;
            }
            Result result = handler.handle(conn, d.attemptOf(call.key()));
            try (PreparedStatement ps = finish(conn, d.token(), result, ";COMMIT")) {
                ps.execute();
            }
            done = true;
            return result.response();
        } finally {
            if (!handedOver) {
                release(conn, done);
            }
        }
    }

    /** What an external-call handler gets. */
    public final class External {
        public final Attempt attempt;
        private final AtomicBoolean lost = new AtomicBoolean();

        External(Attempt attempt) {
            this.attempt = attempt;
        }

        /** True once a heartbeat found the lease taken over. */
        public boolean leaseLost() {
            return lost.get();
        }

        /** idem_checkpoint: how far the attempt got. */
        public void checkpoint(String point) throws SQLException {
            statement("SELECT " + prefix + "idem_checkpoint(?, ?)", attempt.token(), point);
        }

        /** idem_derive_key(key, step): the key of a downstream call. */
        public String deriveKey(String step) throws SQLException {
            return statement("SELECT " + prefix + "idem_derive_key(?, ?)", attempt.key(), step);
        }
    }

    /** One statement of two text arguments in a transaction of its own; its first column. */
    private String statement(String sql, String a, String b) throws SQLException {
        Connection conn = connections.take();
        boolean done = false;
        try (PreparedStatement ps = conn.prepareStatement(sql)) {
            ps.setString(1, a);
            ps.setString(2, b);
            String value;
            try (ResultSet r = ps.executeQuery()) {
                r.next();
                value = r.getString(1);
            }
            conn.commit();
            done = true;
            return value;
        } finally {
            release(conn, done);
        }
    }

    /** Gives a connection back, rolled back first unless its work is done (closed if that fails). */
    private void release(Connection conn, boolean done) {
        boolean broken = false;
        if (!done) {
            try {
                conn.rollback();
            } catch (SQLException e) {
                broken = true;
            }
        }
        connections.give(conn, broken);
    }

    /**
     * Three transactions, for a side effect outside the database: the claim
     * commits with a lease (call.lease(), default 30 s), extended every
     * third of it while the handler runs, then the result commits.
     * RetryableException stores a retryable failure (503); any other
     * exception leaves the record processing, and once its lease ends
     * retries answer unknown (409) or, with on_lease_expiry "retry", proceed
     * from the last checkpoint.
     */
    public Response runExternal(Call call, ExternalHandler handler) throws Exception {
        if (call.key() == null) {
            return error(400, "IDEMPOTENCY_KEY_MISSING", "the Idempotency-Key header is required");
        }
        Call c = call.lease() == null ? call.withLease(Duration.ofSeconds(30)) : call;
        Decision d;
        Connection conn = connections.take();
        boolean done = false;
        try (PreparedStatement ps = claim(conn, c, false)) { // idem_claim: a lease is given
            d = Decision.read(ps);
            conn.commit();
            done = true;
        } catch (SQLException e) {
            Response r = refuse(e);
            if (r == null) {
                throw e;
            }
            return r;
        } finally {
            release(conn, done);
        }
        if (!d.outcome().equals("proceed")) {
            return answer(d);
        }
        External ext = new External(d.attemptOf(c.key()));
        long every = Math.max(c.lease().toMillis() / 3, 10);
        ScheduledFuture<?> beat = heartbeats.scheduleAtFixedRate(() -> {
            try {
                statement("SELECT " + prefix + "idem_heartbeat(?, ?::interval)::text", d.token(), interval(c.lease()));
            } catch (SQLException e) {
                if ("55000".equals(e.getSQLState())) {
                    ext.lost.set(true);
                    throw new IllegalStateException("lease lost"); // ends the schedule
                }
            }
        }, every, every, TimeUnit.MILLISECONDS);
        Result result;
        try {
            result = handler.handle(ext);
        } catch (RetryableException e) {
            Map<String, Object> body = new LinkedHashMap<>();
            body.put("error_code", "RETRYABLE_FAILURE");
            body.put("message", e.getMessage());
            result = new Result(503, jsonHeaders("Retry-After", "1"),
                                Json.write(body).getBytes(StandardCharsets.UTF_8), null, true, true);
        } finally {
            beat.cancel(false);
        }
        conn = connections.take();
        done = false;
        try (PreparedStatement ps = finish(conn, d.token(), result, "")) {
            ps.execute();
            conn.commit();
            done = true;
            return result.response();
        } catch (SQLException e) {
            throw "55000".equals(e.getSQLState()) ? new LeaseLostException(e) : e;
        } finally {
            release(conn, done);
        }
    }
}
