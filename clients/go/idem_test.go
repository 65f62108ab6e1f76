package idem

// Tests against a running PostgreSQL with the extension and
// examples/schema.sql, from libpq's environment (PGHOST, PGPORT,
// PGDATABASE, PGUSER: the role the schema grants the API to).

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v4/pgxpool"
	_ "github.com/jackc/pgx/v4/stdlib"
)

var run = newKey()[:8]

func newKey() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func op(t *testing.T) string { return "test.go." + t.Name() + "." + run }

func pool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	config, err := pgxpool.ParseConfig("")
	if err != nil {
		t.Fatal(err)
	}
	config.MaxConns = 4
	p, err := pgxpool.ConnectConfig(context.Background(), config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func payments(t *testing.T, p *pgxpool.Pool, key string) int {
	var n int
	if err := p.QueryRow(context.Background(), "SELECT count(*) FROM payments WHERE idempotency_key = $1", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func pay(amount int) func(context.Context, Querier, Attempt) (Result, error) {
	return func(ctx context.Context, q Querier, a Attempt) (Result, error) {
		var id string
		if err := q.QueryRow(ctx, "INSERT INTO payments (idempotency_key, amount, currency) VALUES ($1, $2, 'EUR') RETURNING id",
			a.Key, amount).Scan(&id); err != nil {
			return Result{}, err
		}
		r, err := JSON(201, map[string]interface{}{"id": id, "amount": amount},
			[2]string{"Location", "/payments/" + id}, [2]string{"X-Tag", "a"}, [2]string{"X-Tag", "b"})
		r.ResourceID = id
		return r, err
	}
}

func never(context.Context, Querier, Attempt) (Result, error) {
	return Result{}, errors.New("the handler must not run")
}

func code(r Response) string {
	var body struct {
		ErrorCode string `json:"error_code"`
	}
	json.Unmarshal(r.Body, &body)
	return body.ErrorCode
}

func TestRunNewKeyReplayMismatch(t *testing.T) {
	p := pool(t)
	idem := Pgx{Pool: p}
	ctx := context.Background()
	key := newKey()
	c := Call{Operation: op(t), Key: &key, Request: []byte(`{"amount": 10, "currency": "EUR"}`)}
	first, err := idem.Run(ctx, c, pay(10))
	if err != nil || first.Status != 201 || first.Outcome != "proceed" || len(first.Headers) != 4 {
		t.Fatalf("first: %+v %v", first, err)
	}
	c.Request = []byte(`{"currency": "EUR", "amount": 10}`)
	again, err := idem.Run(ctx, c, never)
	if err != nil || !again.Replayed || again.Status != 201 || !bytes.Equal(again.Body, first.Body) ||
		len(again.Headers) != 5 || again.Headers[4] != [2]string{"Idempotent-Replayed", "true"} ||
		again.Headers[2] != first.Headers[2] {
		t.Fatalf("replay: %+v %v", again, err)
	}
	c.Request = []byte(`{"amount": 11}`)
	other, err := idem.Run(ctx, c, never)
	if err != nil || other.Status != 422 || code(other) != "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST" {
		t.Fatalf("mismatch: %+v %v", other, err)
	}
	if n := payments(t, p, key); n != 1 {
		t.Fatalf("%d payments", n)
	}
}

func TestRunBadKeysAndRollback(t *testing.T) {
	p := pool(t)
	idem := Pgx{Pool: p}
	ctx := context.Background()
	r, err := idem.Run(ctx, Call{Operation: op(t)}, never)
	if err != nil || r.Status != 400 || code(r) != "IDEMPOTENCY_KEY_MISSING" {
		t.Fatalf("missing: %+v %v", r, err)
	}
	for _, bad := range []string{"", strings.Repeat("k", 300), "caf\u00e9"} {
		bad := bad
		r, err := idem.Run(ctx, Call{Operation: op(t), Key: &bad}, never)
		if err != nil || r.Status != 400 || code(r) != "IDEMPOTENCY_KEY_INVALID" {
			t.Fatalf("%q: %+v %v", bad, r, err)
		}
	}
	key := newKey()
	c := Call{Operation: op(t), Key: &key, Request: []byte(`{"amount": 12}`)}
	_, err = idem.Run(ctx, c, func(ctx context.Context, q Querier, a Attempt) (Result, error) {
		if _, err := pay(12)(ctx, q, a); err != nil {
			return Result{}, err
		}
		return Result{}, errors.New("boom")
	})
	if err == nil || err.Error() != "boom" || payments(t, p, key) != 0 {
		t.Fatalf("rollback: %v", err)
	}
	r, err = idem.Run(ctx, c, pay(12))
	if err != nil || r.Outcome != "proceed" || payments(t, p, key) != 1 {
		t.Fatalf("retry: %+v %v", r, err)
	}
	key = newKey()
	c.Key = &key
	failed, err := idem.Run(ctx, c, func(context.Context, Querier, Attempt) (Result, error) {
		r, err := JSON(400, map[string]string{"error_code": "VALIDATION_FAILED"})
		r.Failed = true
		return r, err
	})
	again, err2 := idem.Run(ctx, c, never)
	if err != nil || err2 != nil || failed.Status != 400 || !again.Replayed || !bytes.Equal(again.Body, failed.Body) {
		t.Fatalf("failed: %+v %+v %v %v", failed, again, err, err2)
	}
}

func TestRunInProgress(t *testing.T) {
	p := pool(t)
	idem := Pgx{Pool: p}
	ctx := context.Background()
	key := newKey()
	c := Call{Operation: op(t), Key: &key, Request: []byte(`{"amount": 13}`)}
	inside, release := make(chan struct{}), make(chan struct{})
	var first Response
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		first, _ = idem.Run(ctx, c, func(ctx context.Context, q Querier, a Attempt) (Result, error) {
			close(inside)
			<-release
			return pay(13)(ctx, q, a)
		})
	}()
	<-inside
	r, err := idem.Run(ctx, c, never)
	close(release)
	wg.Wait()
	if err != nil || r.Status != 409 || code(r) != "IDEMPOTENCY_REQUEST_IN_PROGRESS" || r.Header("Retry-After") == "" {
		t.Fatalf("in progress: %+v %v", r, err)
	}
	if first.Status != 201 {
		t.Fatalf("first: %+v", first)
	}
}

// The external-call form, over pgx and over database/sql.
func TestRunExternal(t *testing.T) {
	p := pool(t)
	db, err := sql.Open("pgx", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	t.Run("pgx", func(t *testing.T) { testExternal(t, Pgx{Pool: p}) })
	t.Run("sql", func(t *testing.T) { testExternal(t, SQL{DB: db}) })
}

func testExternal(t *testing.T, idem runner) {
	ctx := context.Background()
	key := newKey()
	c := Call{Operation: op(t), Key: &key, Request: []byte(`{}`), Lease: 5 * time.Second}
	inside, release := make(chan string), make(chan struct{})
	var first Response
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		first, _ = idem.RunExternal(ctx, c, func(ctx context.Context, e External) (Result, error) {
			k, err := e.DeriveKey(ctx, "charge")
			inside <- k
			<-release
			if err != nil {
				return Result{}, err
			}
			return JSON(201, map[string]bool{"charged": true})
		})
	}()
	derived := <-inside
	busy, err := idem.RunExternal(ctx, c, nil)
	close(release)
	wg.Wait()
	if err != nil || busy.Outcome != "in_progress" || len(derived) != 36 || first.Status != 201 {
		t.Fatalf("external: %+v %+v %q %v", busy, first, derived, err)
	}
	if again, err := idem.RunExternal(ctx, c, nil); err != nil || !again.Replayed {
		t.Fatalf("replay: %+v %v", again, err)
	}

	// an error: unknown once the lease ends
	key2 := newKey()
	c2 := Call{Operation: op(t), Key: &key2, Lease: 50 * time.Millisecond}
	if _, err := idem.RunExternal(ctx, c2, func(context.Context, External) (Result, error) {
		return Result{}, errors.New("timeout")
	}); err == nil {
		t.Fatal("the error is returned")
	}
	deadline := time.Now().Add(20 * time.Second)
	var r Response
	for {
		r, err = idem.RunExternal(ctx, c2, nil)
		if err != nil || r.Outcome != "in_progress" || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || r.Status != 409 || code(r) != "IDEMPOTENCY_OUTCOME_UNKNOWN" {
		t.Fatalf("unknown: %+v %v", r, err)
	}

	// retryable: the retry runs as attempt 2
	key3 := newKey()
	c3 := Call{Operation: op(t), Key: &key3}
	r, err = idem.RunExternal(ctx, c3, func(context.Context, External) (Result, error) {
		return Result{}, ErrRetryable
	})
	if err != nil || r.Status != 503 || r.Header("Retry-After") != "1" {
		t.Fatalf("retryable: %+v %v", r, err)
	}
	r, err = idem.RunExternal(ctx, c3, func(_ context.Context, e External) (Result, error) {
		return JSON(200, map[string]int32{"attempt": e.Attempt.Attempt})
	})
	if err != nil || string(r.Body) != `{"attempt":2}` {
		t.Fatalf("attempt 2: %+v %v", r, err)
	}
}

func TestSQL(t *testing.T) {
	p := pool(t)
	db, err := sql.Open("pgx", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	idem := SQL{DB: db}
	ctx := context.Background()
	key := newKey()
	c := Call{Operation: op(t), Key: &key, Request: []byte(`{"amount": 14}`)}
	first, err := idem.Run(ctx, c, func(ctx context.Context, tx *sql.Tx, a Attempt) (Result, error) {
		var id string
		if err := tx.QueryRowContext(ctx, "INSERT INTO payments (idempotency_key, amount, currency) VALUES ($1, 14, 'EUR') RETURNING id",
			a.Key).Scan(&id); err != nil {
			return Result{}, err
		}
		return JSON(201, map[string]string{"id": id})
	})
	if err != nil || first.Status != 201 {
		t.Fatalf("first: %+v %v", first, err)
	}
	again, err := idem.Run(ctx, c, nil)
	if err != nil || !again.Replayed || !bytes.Equal(again.Body, first.Body) || payments(t, p, key) != 1 {
		t.Fatalf("replay: %+v %v", again, err)
	}
	bad := ""
	if r, err := idem.Run(ctx, Call{Operation: op(t), Key: &bad}, nil); err != nil || r.Status != 400 {
		t.Fatalf("bad key: %+v %v", r, err)
	}
}

func TestMiddleware(t *testing.T) {
	p := pool(t)
	runs := map[string]int{}
	var mu sync.Mutex
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := AttemptFrom(r.Context())
		mu.Lock()
		runs[a.Key]++
		mu.Unlock()
		var body struct {
			N     int
			Crash bool
		}
		json.Unmarshal(BodyFrom(r.Context()), &body)
		if body.Crash {
			http.Error(w, "crash", 500)
			return
		}
		var n int
		QuerierFrom(r.Context()).QueryRow(r.Context(), "SELECT $1::int + 1", body.N).Scan(&n)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Add("X-Tag", "a")
		w.Header().Add("X-Tag", "b")
		w.WriteHeader(201)
		json.NewEncoder(w).Encode(map[string]int{"n": n})
	})
	srv := httptest.NewServer(Middleware(Pgx{Pool: p}, Options{Operation: op(t),
		Check: func(r *http.Request, body []byte) error {
			if len(body) == 0 {
				return &Error{400, "EMPTY", "a body is required"}
			}
			return nil
		}})(next))
	defer srv.Close()
	post := func(key, body string) (*http.Response, []byte) {
		req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(body))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(res.Body)
		return res, b.Bytes()
	}
	key := newKey()
	res, first := post(key, `{"n": 41}`)
	if res.StatusCode != 201 || string(first) != "{\"n\":42}\n" || len(res.Header["X-Tag"]) != 2 {
		t.Fatalf("first: %v %q", res, first)
	}
	res, again := post(key, `{"n": 41}`)
	if res.StatusCode != 201 || res.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again, first) || runs[key] != 1 {
		t.Fatalf("replay: %v %q", res, again)
	}
	if res, _ := post(key, `{"n": 7}`); res.StatusCode != 422 {
		t.Fatalf("mismatch: %v", res)
	}
	if res, _ := post("", `{"n": 7}`); res.StatusCode != 400 {
		t.Fatalf("missing key: %v", res)
	}
	if res, b := post(newKey(), ``); res.StatusCode != 400 || !strings.Contains(string(b), "EMPTY") {
		t.Fatalf("check: %v", res)
	}
	crash := newKey()
	post(crash, `{"crash": true}`)
	if res, _ := post(crash, `{"crash": true}`); res.StatusCode != 500 || runs[crash] != 2 {
		t.Fatalf("crash: %v %d", res, runs[crash])
	}
}

// Bytes that are not UTF-8 are the client's bad input (400), in a key or
// in a request, in each runner and behind the middleware: never a 500
// from the server's 22021.
func TestBadUTF8(t *testing.T) {
	p := pool(t)
	db, err := sql.Open("pgx", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	sqlNever := func(context.Context, *sql.Tx, Attempt) (Result, error) { return Result{}, errors.New("must not run") }
	runs := map[string]func(Call) (Response, error){
		"pgx": func(c Call) (Response, error) { return Pgx{Pool: p}.Run(ctx, c, never) },
		"sql": func(c Call) (Response, error) { return SQL{DB: db}.Run(ctx, c, sqlNever) },
		"external": func(c Call) (Response, error) {
			return Pgx{Pool: p}.RunExternal(ctx, c, func(context.Context, External) (Result, error) {
				return Result{}, errors.New("must not run")
			})
		},
	}
	for name, run := range runs {
		key := "caf\xe9-" + newKey()
		r, err := run(Call{Operation: op(t), Key: &key, Request: []byte(`{}`)})
		if err != nil || r.Status != 400 || code(r) != "IDEMPOTENCY_KEY_INVALID" {
			t.Errorf("%s: a key that is not UTF-8: %+v %v", name, r, err)
		}
		key = newKey()
		r, err = run(Call{Operation: op(t), Key: &key, Request: []byte("{\"n\": \"\xff\"}")})
		if err != nil || r.Status != 400 || code(r) != "INVALID_REQUEST" {
			t.Errorf("%s: a request that is not UTF-8: %+v %v", name, r, err)
		}
	}
	srv := httptest.NewServer(Middleware(Pgx{Pool: p}, Options{Operation: op(t)})(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) })))
	defer srv.Close()
	key := newKey()
	for _, body := range []string{"{\"n\": \"\xff\"}", "{\"n\": \"\xfe\"}"} {
		req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		b.ReadFrom(res.Body)
		res.Body.Close()
		if res.StatusCode != 400 || !strings.Contains(b.String(), `"INVALID_JSON"`) {
			t.Errorf("middleware: a body that is not UTF-8: %d %s", res.StatusCode, b.String())
		}
	}
}
