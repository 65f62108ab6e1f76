/*
 * A Servlet Filter that runs the rest of the chain once per Idempotency-Key,
 * inside the claim's transaction, and stores what it writes: a status below
 * 400 with idem_complete, 4xx with idem_fail (replayed), 5xx not at all (the
 * transaction rolls back; a retry runs again).  The servlet finds the
 * claim's connection in the request attribute CONNECTION and the attempt in
 * ATTEMPT; the request's JSON body is the fingerprint's request, and the
 * servlet reads it again from the request as usual.
 */
package idempotency;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import javax.servlet.Filter;
import javax.servlet.FilterChain;
import javax.servlet.ReadListener;
import javax.servlet.ServletException;
import javax.servlet.ServletInputStream;
import javax.servlet.ServletOutputStream;
import javax.servlet.ServletRequest;
import javax.servlet.ServletResponse;
import javax.servlet.WriteListener;
import javax.servlet.http.HttpServletRequest;
import javax.servlet.http.HttpServletRequestWrapper;
import javax.servlet.http.HttpServletResponse;
import javax.servlet.http.HttpServletResponseWrapper;

public final class IdempotencyFilter implements Filter {
    public static final String CONNECTION = "idempotency.connection";
    public static final String ATTEMPT = "idempotency.attempt";
    private static final int MAX_BODY = 1 << 20;

    /** Checks of a request before the claim: an HttpError it throws is answered, and nothing is stored. */
    public interface Check {
        void check(HttpServletRequest request, String body) throws Idempotency.HttpError;
    }

    private final Idempotency idem;
    private final String operation;
    private final Check check;

    public IdempotencyFilter(Idempotency idem, String operation) {
        this(idem, operation, null);
    }

    /** check runs before the claim (an HttpError it throws is answered, nothing stored); null: none. */
    public IdempotencyFilter(Idempotency idem, String operation, Check check) {
        this.idem = idem;
        this.operation = operation;
        this.check = check;
    }

    @Override
    public void doFilter(ServletRequest req, ServletResponse res, FilterChain chain)
            throws IOException, ServletException {
        HttpServletRequest request = (HttpServletRequest) req;
        HttpServletResponse response = (HttpServletResponse) res;
        Idempotency.Response answer;
        try {
            byte[] body = request.getInputStream().readNBytes(MAX_BODY + 1);
            if (body.length > MAX_BODY) {
                throw new Idempotency.HttpError(413, "BODY_TOO_LARGE", "the body is too large");
            }
            String text = Idempotency.bodyText(body);
            if (!text.isEmpty()) {
                try {
                    Json.parse(text);
                } catch (IllegalArgumentException e) {
                    throw new Idempotency.HttpError(400, "INVALID_JSON", "the body is not valid JSON");
                }
            }
            String key = Idempotency.headerKey(java.util.Collections.list(request.getHeaders("Idempotency-Key")));
            if (check != null) {
                check.check(request, text);
            }
            Idempotency.Call call = Idempotency.Call.of(operation, key,
                                                        text.isEmpty() ? null : text);
            answer = idem.run(call, (conn, attempt) -> {
                Recorder recorder = new Recorder(response);
                Replayed again = new Replayed(request, body);
                again.setAttribute(CONNECTION, conn);
                again.setAttribute(ATTEMPT, attempt);
                chain.doFilter(again, recorder);
                int status = recorder.status;
                if (status >= 500) {
                    throw new Idempotency.HttpError(status, "INTERNAL_ERROR", "the request failed; try again");
                }
                return new Idempotency.Result(status, recorder.headers, recorder.body(), null, status >= 400, false);
            });
        } catch (Idempotency.HttpError e) {
            answer = e.response();
        } catch (IOException | ServletException | RuntimeException e) {
            throw e;
        } catch (Exception e) {
            throw new ServletException(e);
        }
        send(response, answer);
    }

    /** Sends a Response: its header pairs in order, and Content-Length. */
    public static void send(HttpServletResponse response, Idempotency.Response answer) throws IOException {
        response.setStatus(answer.status());
        for (List<String> h : answer.headers()) {
            response.addHeader(h.get(0), h.get(1));
        }
        response.setContentLength(answer.body().length);
        response.getOutputStream().write(answer.body());
    }

    /** The request with its body to read again. */
    private static final class Replayed extends HttpServletRequestWrapper {
        private final byte[] body;

        Replayed(HttpServletRequest request, byte[] body) {
            super(request);
            this.body = body;
        }

        @Override
        public ServletInputStream getInputStream() {
            return inputStream(body);
        }
    }

    /** A ServletInputStream of bytes (a request body read again). */
    public static ServletInputStream inputStream(byte[] body) {
        ByteArrayInputStream in = new ByteArrayInputStream(body);
        return new ServletInputStream() {
            @Override
            public int read() {
                return in.read();
            }

            @Override
            public boolean isFinished() {
                return in.available() == 0;
            }

            @Override
            public boolean isReady() {
                return true;
            }

            @Override
            public void setReadListener(ReadListener listener) {
                throw new UnsupportedOperationException("the body is read already");
            }
        };
    }

    /** Keeps what the chain writes, to store it before it is sent. */
    private static final class Recorder extends HttpServletResponseWrapper {
        final List<List<String>> headers = new ArrayList<>();
        final ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        int status = 200;
        private PrintWriter writer;

        Recorder(HttpServletResponse response) {
            super(response);
        }

        byte[] body() {
            if (writer != null) {
                writer.flush();
            }
            return bytes.toByteArray();
        }

        @Override
        public void setStatus(int sc) {
            status = sc;
        }

        @Override
        public void sendError(int sc) {
            status = sc;
        }

        @Override
        public void sendError(int sc, String msg) {
            status = sc;
        }

        @Override
        public int getStatus() {
            return status;
        }

        @Override
        public void setHeader(String name, String value) {
            headers.removeIf(h -> h.get(0).equalsIgnoreCase(name));
            addHeader(name, value);
        }

        @Override
        public void addHeader(String name, String value) {
            headers.add(List.of(name, value));
        }

        @Override
        public void setIntHeader(String name, int value) {
            setHeader(name, String.valueOf(value));
        }

        @Override
        public void addIntHeader(String name, int value) {
            addHeader(name, String.valueOf(value));
        }

        @Override
        public void setContentType(String type) {
            setHeader("Content-Type", type);
        }

        @Override
        public void setContentLength(int len) {
            // sent with the stored body
        }

        @Override
        public void setContentLengthLong(long len) {
            // sent with the stored body
        }

        @Override
        public String getHeader(String name) {
            return headers.stream().filter(h -> h.get(0).equalsIgnoreCase(name)).map(h -> h.get(1))
                .findFirst().orElse(null);
        }

        @Override
        public boolean containsHeader(String name) {
            return getHeader(name) != null;
        }

        @Override
        public ServletOutputStream getOutputStream() {
            return new ServletOutputStream() {
                @Override
                public void write(int b) {
                    bytes.write(b);
                }

                @Override
                public void write(byte[] b, int off, int len) {
                    bytes.write(b, off, len);
                }

                @Override
                public boolean isReady() {
                    return true;
                }

                @Override
                public void setWriteListener(WriteListener listener) {
                    throw new UnsupportedOperationException("the response is recorded");
                }
            };
        }

        @Override
        public PrintWriter getWriter() {
            if (writer == null) {
                writer = new PrintWriter(new OutputStreamWriter(bytes, StandardCharsets.UTF_8));
            }
            return writer;
        }
    }
}
