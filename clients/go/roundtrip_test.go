package idem

// Round trips, counted by a proxy between the pool and the server, in each
// of pgx's ways of sending a statement: prepared statements (the default),
// described statements (statement_cache_mode=describe) and the simple
// protocol (what a pooler in transaction mode needs, such as pgbouncer
// before 1.21).

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgconn/stmtcache"
	"github.com/jackc/pgx/v4/pgxpool"
)

var modes = map[string]func(*pgxpool.Config){
	"prepare": func(*pgxpool.Config) {},
	"describe": func(c *pgxpool.Config) {
		c.ConnConfig.BuildStatementCache = func(conn *pgconn.PgConn) stmtcache.Cache {
			return stmtcache.New(conn, stmtcache.ModeDescribe, 512)
		}
	},
	"simple": func(c *pgxpool.Config) { c.ConnConfig.PreferSimpleProtocol = true },
}

// proxy forwards one client's connections to the server.  A round trip is
// counted each time the client sends after the server did.  With held set,
// a simple query COMMIT is held back until release is closed.
type proxy struct {
	listener net.Listener
	target   string
	mu       sync.Mutex
	trips    int
	server   bool // the last bytes were the server's
	held     chan struct{}
	release  chan struct{}
}

func newProxy(t *testing.T, target string) *proxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{listener: l, target: target}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			go p.fromServer(server, client)
			go p.fromClient(client, server)
		}
	}()
	return p
}

func (p *proxy) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.trips
}

// hold holds back the next COMMIT sent as a simple query.
func (p *proxy) hold() (held, release chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held, p.release = make(chan struct{}), make(chan struct{})
	return p.held, p.release
}

func (p *proxy) fromServer(server, client net.Conn) {
	defer client.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 {
			p.mu.Lock()
			p.server = true
			p.mu.Unlock()
			if _, err := client.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// fromClient reads the client's messages one by one: the startup message
// has no type byte, every later one has.
func (p *proxy) fromClient(client, server net.Conn) {
	defer server.Close()
	typed := false
	for {
		head := make([]byte, 5)
		if !typed {
			head = head[1:]
		}
		if _, err := io.ReadFull(client, head); err != nil {
			return
		}
		size := binary.BigEndian.Uint32(head[len(head)-4:])
		msg := make([]byte, len(head)+int(size)-4)
		copy(msg, head)
		if _, err := io.ReadFull(client, msg[len(head):]); err != nil {
			return
		}
		if typed && msg[0] == 'Q' && bytes.Equal(msg[5:], []byte("COMMIT\x00")) {
			p.mu.Lock()
			held, release := p.held, p.release
			p.held = nil
			p.mu.Unlock()
			if held != nil {
				close(held)
				<-release
			}
		}
		typed = true
		p.mu.Lock()
		if p.server {
			p.trips++
			p.server = false
		}
		p.mu.Unlock()
		if _, err := server.Write(msg); err != nil {
			return
		}
	}
}

// proxied is a pool of one connection through a proxy, in a mode.
func proxied(t *testing.T, mode string) (*pgxpool.Pool, *proxy) {
	config, err := pgxpool.ParseConfig("")
	if err != nil {
		t.Fatal(err)
	}
	target := net.JoinHostPort(config.ConnConfig.Host, strconv.Itoa(int(config.ConnConfig.Port)))
	if config.ConnConfig.Host == "" || config.ConnConfig.Host[0] == '/' {
		t.Skip("PGHOST is a Unix-domain socket: the proxy needs TCP")
	}
	px := newProxy(t, target)
	addr := px.listener.Addr().(*net.TCPAddr)
	config.ConnConfig.Host, config.ConnConfig.Port = addr.IP.String(), uint16(addr.Port)
	config.ConnConfig.TLSConfig, config.ConnConfig.Fallbacks = nil, nil
	config.MaxConns = 1
	modes[mode](config)
	p, err := pgxpool.ConnectConfig(context.Background(), config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, px
}

// idle waits until the pool's connection is back, for 20 s at most.
func idle(t *testing.T, p *pgxpool.Pool) {
	deadline := time.Now().Add(20 * time.Second)
	for p.Stat().AcquiredConns() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the connection did not come back to the pool")
		}
		time.Sleep(time.Millisecond)
	}
}

// eachMode runs test in each mode, over a pool of one connection through a
// proxy.
func eachMode(t *testing.T, test func(t *testing.T, p *pgxpool.Pool, px *proxy)) {
	for mode := range modes {
		mode := mode
		t.Run(mode, func(t *testing.T) {
			p, px := proxied(t, mode)
			test(t, p, px)
		})
	}
}

func TestRoundTrips(t *testing.T) {
	eachMode(t, func(t *testing.T, p *pgxpool.Pool, px *proxy) {
		idem := Pgx{Pool: p}
		ctx := context.Background()
		c := Call{Operation: op(t), Request: []byte(`{"amount": 20}`)}
		// the first call of each statement may describe or prepare it
		for i := 0; i < 2; i++ {
			key := newKey()
			c.Key = &key
			if _, err := idem.Run(ctx, c, pay(20)); err != nil {
				t.Fatal(err)
			}
			if _, err := idem.Run(ctx, c, never); err != nil {
				t.Fatal(err)
			}
			idle(t, p)
		}

		key := newKey()
		c.Key = &key
		before := px.count()
		r, err := idem.Run(ctx, c, pay(20))
		if n := px.count() - before; err != nil || r.Status != 201 || n != 3 {
			t.Fatalf("a new key: %d round trips, %+v %v", n, r, err)
		}

		// the replay is answered before its COMMIT is sent, and the
		// connection stays out of the pool until it is through
		held, release := px.hold()
		before = px.count()
		done := make(chan struct{})
		go func() {
			defer close(done)
			r, err = idem.Run(ctx, c, never)
		}()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			close(release)
			t.Fatal("the replay's answer waits for its COMMIT")
		}
		if n := px.count() - before; err != nil || !r.Replayed || n != 1 {
			t.Fatalf("a replay: %d round trips, %+v %v", n, r, err)
		}
		select {
		case <-held:
		case <-time.After(20 * time.Second):
			t.Fatal("no COMMIT after the replay")
		}
		if busy := p.Stat().AcquiredConns(); busy != 1 {
			t.Fatalf("the connection is back in the pool before its COMMIT: %d", busy)
		}
		close(release)
		idle(t, p)
		if n := px.count() - before; n != 2 {
			t.Fatalf("the replay and its COMMIT: %d round trips", n)
		}
	})
}

// Every outcome through each mode, on the one connection: no call gets it
// with a transaction open.
func TestModes(t *testing.T) {
	eachMode(t, func(t *testing.T, p *pgxpool.Pool, _ *proxy) {
		idem := Pgx{Pool: p}
		ctx := context.Background()
		key := newKey()
		c := Call{Operation: op(t), Key: &key, Request: []byte(`{"amount": 21, "note": "it's \\ 'quoted'"}`)}
		first, err := idem.Run(ctx, c, pay(21))
		if err != nil || first.Status != 201 {
			t.Fatalf("first: %+v %v", first, err)
		}
		for i := 0; i < 3; i++ {
			again, err := idem.Run(ctx, c, never)
			if err != nil || !again.Replayed || !bytes.Equal(again.Body, first.Body) {
				t.Fatalf("replay %d: %+v %v", i, again, err)
			}
		}
		c.Request = []byte(`{"amount": 22}`)
		if r, err := idem.Run(ctx, c, never); err != nil || r.Status != 422 {
			t.Fatalf("mismatch: %+v %v", r, err)
		}
		bad := "caf\u00e9'"
		if r, err := idem.Run(ctx, Call{Operation: op(t), Key: &bad}, never); err != nil || r.Status != 400 {
			t.Fatalf("bad key: %+v %v", r, err)
		}
		key2 := newKey()
		c2 := Call{Operation: op(t), Key: &key2, Request: []byte(`{}`)}
		if _, err := idem.Run(ctx, c2, func(context.Context, Querier, Attempt) (Result, error) {
			return Result{}, errors.New("boom")
		}); err == nil {
			t.Fatal("the handler's error is returned")
		}
		r, err := idem.Run(ctx, c2, func(context.Context, Querier, Attempt) (Result, error) {
			return Result{Status: 400, Headers: [][2]string{{"X-Quote", `it's \ "q"`}}, Body: []byte("\x00\xff"), Failed: true}, nil
		})
		if err != nil || r.Status != 400 {
			t.Fatalf("after a rollback: %+v %v", r, err)
		}
		r, err = idem.Run(ctx, c2, never)
		if err != nil || !r.Replayed || !bytes.Equal(r.Body, []byte("\x00\xff")) || r.Header("X-Quote") != `it's \ "q"` {
			t.Fatalf("failure replayed: %+v %v", r, err)
		}
		idle(t, p)
		var status byte
		if err := p.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
			status = c.Conn().PgConn().TxStatus()
			return nil
		}); err != nil || status != 'I' {
			t.Fatalf("the pool's connection: %q %v", status, err)
		}
	})
}

// A claim that finds an ended lease writes the record unknown: that answer
// waits for its COMMIT, and the connection is back in the pool when it is
// returned.
func TestUnknownCommitsFirst(t *testing.T) {
	p, px := proxied(t, "prepare")
	idem := Pgx{Pool: p}
	ctx := context.Background()
	key := newKey()
	c := Call{Operation: op(t), Key: &key, Request: []byte(`{}`)}
	// a lease of 1 ms, over once 10 ms have passed
	if _, err := p.Exec(ctx, `SELECT idem_claim($1, $2, '{}', lease => '1 millisecond')`, c.Operation, key); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, `SELECT pg_sleep(0.01)`); err != nil {
		t.Fatal(err)
	}
	held, release := px.hold()
	var r Response
	var err error
	busy := -1
	done := make(chan struct{})
	go func() {
		defer close(done)
		r, err = idem.Run(ctx, c, never)
		busy = int(p.Stat().AcquiredConns())
	}()
	<-held
	close(release)
	<-done
	if err != nil || r.Outcome != "unknown" || busy != 0 {
		t.Fatalf("the claim that ends the lease: %+v %v, %d connections out at its answer", r, err, busy)
	}
	var outcome string
	if err := p.QueryRow(ctx, `SELECT outcome FROM idem_claim($1, $2, '{}')`, c.Operation, key).Scan(&outcome); err != nil || outcome != "unknown" {
		t.Fatalf("the next claim: %q %v", outcome, err)
	}
}

// database/sql: a replay is answered before its COMMIT, which goes on when
// the request's context ends with the answer, on the same connection.
func TestSQLReplayBehind(t *testing.T) {
	db, err := sql.Open("pgx", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	idem := SQL{DB: db}
	ctx := context.Background()
	key := newKey()
	c := Call{Operation: op(t), Key: &key, Request: []byte(`{}`)}
	if r, err := idem.Run(ctx, c, func(context.Context, *sql.Tx, Attempt) (Result, error) {
		return JSON(201, map[string]bool{"ok": true})
	}); err != nil || r.Status != 201 {
		t.Fatalf("first: %+v %v", r, err)
	}
	pid := func() int {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := pid()
	for i := 0; i < 5; i++ {
		cctx, cancel := context.WithCancel(ctx)
		r, err := idem.Run(cctx, c, nil)
		cancel()
		if err != nil || !r.Replayed {
			t.Fatalf("replay %d: %+v %v", i, r, err)
		}
	}
	if after := pid(); after != before {
		t.Fatalf("the connection was dropped: backend %d, then %d", before, after)
	}
}
