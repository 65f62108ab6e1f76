package idem

// idem_claim_text where the server offers it (and idem_claim where it does
// not, or no longer does), the Schema option, and RunExternal over
// database/sql.  The tests that make a role of their own need a superuser
// connection (IDEM_ADMIN_DSN; scripts/test.sh passes one) and are skipped
// without.

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v4/pgxpool"
	"github.com/jackc/pgx/v4/stdlib"
)

// runners are the two ways of running a call, over the same pool or DB.
type runner interface {
	run(ctx context.Context, c Call, h func(ctx context.Context) (Result, error)) (Response, error)
	RunExternal(ctx context.Context, c Call, h func(ctx context.Context, e External) (Result, error)) (Response, error)
}

func (p Pgx) run(ctx context.Context, c Call, h func(context.Context) (Result, error)) (Response, error) {
	return p.Run(ctx, c, func(ctx context.Context, _ Querier, _ Attempt) (Result, error) { return h(ctx) })
}

func (s SQL) run(ctx context.Context, c Call, h func(context.Context) (Result, error)) (Response, error) {
	return s.Run(ctx, c, func(ctx context.Context, _ *sql.Tx, _ Attempt) (Result, error) { return h(ctx) })
}

func created(context.Context) (Result, error) { return JSON(201, map[string]bool{"ok": true}) }

func neverRuns(context.Context) (Result, error) {
	return Result{}, errors.New("the handler must not run")
}

// connected is a pgx pool and a database/sql DB over config (the last
// value of each setting wins).
func connected(t *testing.T, config string, params map[string]string) (*pgxpool.Pool, *sql.DB) {
	t.Helper()
	pc, err := pgxpool.ParseConfig(config)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 2
	for k, v := range params {
		pc.ConnConfig.RuntimeParams[k] = v
	}
	p, err := pgxpool.ConnectConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	db := stdlib.OpenDB(*pc.ConnConfig)
	t.Cleanup(func() { db.Close() })
	return p, db
}

// eachRunner runs test over Pgx and over SQL, with schema.
func eachRunner(t *testing.T, p *pgxpool.Pool, db *sql.DB, schema string, test func(t *testing.T, idem runner)) {
	t.Run("pgx", func(t *testing.T) { test(t, Pgx{Pool: p, Schema: schema}) })
	t.Run("sql", func(t *testing.T) { test(t, SQL{DB: db, Schema: schema}) })
}

// admin is a superuser connection, or the test is skipped.
func admin(t *testing.T) *pgxpool.Pool {
	t.Helper()
	dsn := os.Getenv("IDEM_ADMIN_DSN")
	if dsn == "" {
		t.Skip("no IDEM_ADMIN_DSN")
	}
	p, err := pgxpool.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// roleWith is a role of its own with EXECUTE on the functions named (and
// nothing else of ours), and a pool and DB of the superuser's connections
// acting as it.
func roleWith(t *testing.T, a *pgxpool.Pool, functions string) (string, *pgxpool.Pool, *sql.DB) {
	t.Helper()
	ctx := context.Background()
	role := "idem_go_" + strings.ToLower(t.Name()[4:]) + "_" + run
	role = strings.NewReplacer("/", "_").Replace(role)
	if _, err := a.Exec(ctx, "CREATE ROLE "+role+"; GRANT EXECUTE ON FUNCTION "+functions+" TO "+role); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE "+role) })
	p, db := connected(t, os.Getenv("IDEM_ADMIN_DSN"), map[string]string{"role": role})
	return role, p, db
}

func claimTextOf(r runner) int32 {
	switch r := r.(type) {
	case Pgx:
		return r.calls().claimText.get()
	case SQL:
		return r.calls().claimText.get()
	}
	return -1
}

// A call with no option but the tenant goes to idem_claim_text: a role
// that may execute idem_claim_text but not idem_claim proceeds, and its
// replay answers; the same key through idem_claim (the role granted it)
// answers alike: the same fingerprint.
func TestClaimText(t *testing.T) {
	a := admin(t)
	ctx := context.Background()
	role, p, db := roleWith(t, a, "idem_claim_text, idem_complete, idem_fail")
	eachRunner(t, p, db, "", func(t *testing.T, idem runner) {
		key := newKey()
		c := Call{Operation: op(t), Key: &key, Request: []byte(`{"amount": 19, "note": "a \"b\" \\ é"}`),
			Tenant: `tenant \ 't'`}
		first, err := idem.run(ctx, c, created)
		if err != nil || first.Status != 201 || claimTextOf(idem) != claimTextYes {
			t.Fatalf("idem_claim_text alone: %+v %v (state %d)", first, err, claimTextOf(idem))
		}
		again, err := idem.run(ctx, c, neverRuns)
		if err != nil || !again.Replayed || !bytes.Equal(again.Body, first.Body) {
			t.Fatalf("its replay: %+v %v", again, err)
		}
		// An option other than the tenant: idem_claim, which the role may
		// not execute.
		c.Wait = 1
		if _, err := idem.run(ctx, c, neverRuns); sqlState(err) != "42501" {
			t.Fatalf("with an option, the claim goes to idem_claim: %v", err)
		}
		if _, err := a.Exec(ctx, "GRANT EXECUTE ON FUNCTION idem_claim TO "+role); err != nil {
			t.Fatal(err)
		}
		defer a.Exec(ctx, "REVOKE EXECUTE ON FUNCTION idem_claim FROM "+role)
		c.Request = []byte(`{"note":"a \"b\" \\ é","amount":19.0}`)
		if r, err := idem.run(ctx, c, neverRuns); err != nil || !r.Replayed || !bytes.Equal(r.Body, first.Body) {
			t.Fatalf("idem_claim answers idem_claim_text's record alike: %+v %v", r, err)
		}
		c.Request = []byte(`{"amount": 20}`)
		if r, err := idem.run(ctx, c, neverRuns); err != nil || r.Outcome != "mismatch" {
			t.Fatalf("another request through idem_claim: %+v %v", r, err)
		}
		c.Wait = 0
		if r, err := idem.run(ctx, c, neverRuns); err != nil || r.Outcome != "mismatch" {
			t.Fatalf("another request through idem_claim_text: %+v %v", r, err)
		}
		if _, err := a.Exec(ctx, "REVOKE EXECUTE ON FUNCTION idem_claim FROM "+role); err != nil {
			t.Fatal(err)
		}
	})
}

// EXECUTE on idem_claim_text revoked after the first call found it usable:
// the claim refused (42501) goes to idem_claim, and so does every later one.
func TestClaimTextRevoked(t *testing.T) {
	a := admin(t)
	ctx := context.Background()
	role, p, db := roleWith(t, a, "idem_claim, idem_claim_text, idem_complete, idem_fail")
	eachRunner(t, p, db, "", func(t *testing.T, idem runner) {
		if _, err := a.Exec(ctx, "GRANT EXECUTE ON FUNCTION idem_claim_text TO "+role); err != nil {
			t.Fatal(err)
		}
		key := newKey()
		c := Call{Operation: op(t), Key: &key, Request: []byte(`{"amount": 1}`)}
		if r, err := idem.run(ctx, c, created); err != nil || r.Status != 201 || claimTextOf(idem) != claimTextYes {
			t.Fatalf("first: %+v %v (state %d)", r, err, claimTextOf(idem))
		}
		if _, err := a.Exec(ctx, "REVOKE EXECUTE ON FUNCTION idem_claim_text FROM "+role); err != nil {
			t.Fatal(err)
		}
		key2 := newKey()
		c.Key = &key2
		if r, err := idem.run(ctx, c, created); err != nil || r.Status != 201 || claimTextOf(idem) != claimTextNo {
			t.Fatalf("after the REVOKE: %+v %v (state %d)", r, err, claimTextOf(idem))
		}
		if r, err := idem.run(ctx, c, neverRuns); err != nil || !r.Replayed {
			t.Fatalf("its replay: %+v %v", r, err)
		}
	})
}

// Where idem_claim_text is not there (an extension before 1.2: here, a
// schema without it), claims go to idem_claim; and Schema qualifies every
// call, for a search_path without the extension's schema.
func TestSchema(t *testing.T) {
	ctx := context.Background()
	// a search_path without public, where the extension is
	p, db := connected(t, "", map[string]string{"search_path": "pg_catalog"})
	eachRunner(t, p, db, "", func(t *testing.T, idem runner) {
		key := newKey()
		_, err := idem.run(ctx, Call{Operation: op(t), Key: &key, Request: []byte(`{}`)}, neverRuns)
		if sqlState(err) != "42883" || claimTextOf(idem) != claimTextNo {
			t.Fatalf("without Schema, off the search_path: %v (state %d)", err, claimTextOf(idem))
		}
	})
	eachRunner(t, p, db, "public", func(t *testing.T, idem runner) {
		key := newKey()
		c := Call{Operation: op(t), Key: &key, Request: []byte(`{"amount": 2}`)}
		first, err := idem.run(ctx, c, created)
		if err != nil || first.Status != 201 || claimTextOf(idem) != claimTextYes {
			t.Fatalf("Schema public: %+v %v (state %d)", first, err, claimTextOf(idem))
		}
		if r, err := idem.run(ctx, c, neverRuns); err != nil || !r.Replayed {
			t.Fatalf("its replay: %+v %v", r, err)
		}
		// the options' form (idem_claim), the external calls' statements
		key2 := newKey()
		c2 := Call{Operation: op(t), Key: &key2, Request: []byte(`{}`), Lease: 60e9}
		ext, err := idem.RunExternal(ctx, c2, func(ctx context.Context, e External) (Result, error) {
			if err := e.Checkpoint(ctx, "charged"); err != nil {
				return Result{}, err
			}
			k, err := e.DeriveKey(ctx, "charge")
			if err != nil {
				return Result{}, err
			}
			return JSON(201, map[string]string{"derived": k})
		})
		if err != nil || ext.Status != 201 || len(ext.Body) != len(`{"derived":""}`)+36 {
			t.Fatalf("RunExternal with Schema: %+v %v", ext, err)
		}
		if r, err := idem.RunExternal(ctx, c2, nil); err != nil || !r.Replayed || !bytes.Equal(r.Body, ext.Body) {
			t.Fatalf("its replay: %+v %v", r, err)
		}
	})
	// a schema without idem_claim_text (nor anything else of ours)
	eachRunner(t, p, db, "pg_catalog", func(t *testing.T, idem runner) {
		key := newKey()
		_, err := idem.run(ctx, Call{Operation: op(t), Key: &key, Request: []byte(`{}`)}, neverRuns)
		if sqlState(err) != "42883" || claimTextOf(idem) != claimTextNo || !strings.Contains(err.Error(), "pg_catalog.idem_claim(") {
			t.Fatalf("a schema without the extension: %v (state %d)", err, claimTextOf(idem))
		}
	})
	// a schema that does not exist: the server's error, as it is
	eachRunner(t, p, db, "no such schema", func(t *testing.T, idem runner) {
		key := newKey()
		_, err := idem.run(ctx, Call{Operation: op(t), Key: &key, Request: []byte(`{}`)}, neverRuns)
		if sqlState(err) != "3F000" {
			t.Fatalf("a schema that does not exist: %v", err)
		}
	})
	// a name that cannot be one: refused before anything is sent
	eachRunner(t, p, db, "bad\x00name", func(t *testing.T, idem runner) {
		key := newKey()
		_, err := idem.run(ctx, Call{Operation: op(t), Key: &key, Request: []byte(`{}`)}, neverRuns)
		if err == nil || !strings.Contains(err.Error(), "schema") {
			t.Fatalf("a schema name with NUL: %v", err)
		}
		_, err = idem.RunExternal(ctx, Call{Operation: op(t), Key: &key, Request: []byte(`{}`)}, nil)
		if err == nil || !strings.Contains(err.Error(), "schema") {
			t.Fatalf("a schema name with NUL, RunExternal: %v", err)
		}
	})
}
