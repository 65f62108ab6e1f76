/*
 * A small pool of JDBC connections with autocommit off, for services
 * without one of their own: at most `size` open, a caller waits 30 s at
 * most for a free one.  Any other pool works through Connections.
 */
package idempotency;

import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.util.ArrayDeque;
import java.util.Deque;
import java.util.Properties;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;

public final class Pool implements Idempotency.Connections, AutoCloseable {
    private final String url;
    private final Properties props;
    private final Semaphore free;
    private final Deque<Connection> idle = new ArrayDeque<>();

    public Pool(String url, Properties props, int size) {
        this.url = url;
        this.props = props;
        this.free = new Semaphore(size, true);
    }

    /**
     * The JDBC URL and properties of libpq's environment variables, which
     * JDBC does not read: PGHOST (a host name or address: JDBC does not
     * reach a Unix-domain socket; default localhost), PGPORT, PGDATABASE,
     * PGUSER, PGPASSWORD.
     */
    public static Pool fromEnvironment(int size, String applicationName) {
        return fromEnvironment(size, applicationName, new Properties());
    }

    /**
     * The same, with more of the driver's properties: behind a pooler in
     * transaction mode that does not carry prepared statements from one
     * transaction to the next (pgbouncer before 1.21), prepareThreshold=0,
     * so that the driver never prepares a named statement.
     */
    public static Pool fromEnvironment(int size, String applicationName, Properties more) {
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
        props.setProperty("ApplicationName", applicationName);
        props.putAll(more);
        return new Pool(url, props, size);
    }

    @Override
    public Connection take() throws SQLException {
        try {
            if (!free.tryAcquire(30, TimeUnit.SECONDS)) {
                throw new SQLException("no free connection in 30 s");
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new SQLException("interrupted while waiting for a connection", e);
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
    @Override
    public void give(Connection conn, boolean broken) {
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

    @Override
    public void close() {
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
