// Package idem gives a Go service the Idempotency-Key pattern on the
// idempotency PostgreSQL extension, over pgx v4 (pgxpool) or database/sql,
// with net/http middleware.
//
// The core call is Pgx.Run (or SQL.Run): operation, key and request in; the
// handler runs inside the claim's transaction, on its connection; the HTTP
// answer (status, header pairs, body) out, every outcome of idem_claim
// mapped as the README's table says.  Pgx.RunExternal (or SQL.RunExternal)
// is the form for a side effect outside the database: the claim commits
// with a lease that is extended while the handler runs, then the outcome
// commits.
//
// A claim with no option but the tenant goes to idem_claim_text (1.2) where
// the server offers it to the role, asked once per pool and schema at the
// first call; else, and with any other option, to idem_claim.  Schema
// qualifies every call, for an extension off the search_path.
//
// Round trips over pgx: a new key takes three (BEGIN and the claim in one
// batch, the handler's statements, the completion and COMMIT in one batch);
// a retry one (BEGIN and the claim: the answer does not wait for the COMMIT
// behind it).  Over database/sql, whose Tx sends BEGIN and COMMIT on their
// own, a new key takes five and a retry two.
package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

// Response is an answer to send: status, headers as [name, value] pairs (in
// order, repeats kept) and the body's bytes.  Outcome is idem_claim's ("" when
// the key was refused before the claim); Replayed is true for a replay.
type Response struct {
	Status   int
	Headers  [][2]string
	Body     []byte
	Outcome  string
	Replayed bool
}

// Header is the first value of a header, or "".
func (r Response) Header(name string) string {
	for _, h := range r.Headers {
		if strings.EqualFold(h[0], name) {
			return h[1]
		}
	}
	return ""
}

// Result is what a handler returns.  Failed stores it with idem_fail (it is
// replayed like a success); Retryable stores a failure that a retry runs
// again.
type Result struct {
	Status     int
	Headers    [][2]string
	Body       []byte
	ResourceID string
	Failed     bool
	Retryable  bool
}

// JSON is a Result whose body is v as JSON, with Content-Type first.
func JSON(status int, v interface{}, headers ...[2]string) (Result, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return Result{}, err
	}
	return Result{Status: status, Headers: append([][2]string{jsonType}, headers...), Body: body}, nil
}

// Error is an answer that is not stored: returned by a handler, the
// transaction rolls back (a retry proceeds) and the client gets it.
type Error struct {
	Status    int
	ErrorCode string
	Message   string
}

func (e *Error) Error() string { return e.Message }

// Response is the error as its JSON answer.
func (e *Error) Response() Response {
	return errorResponse(e.Status, e.ErrorCode, e.Message)
}

// ErrLeaseLost: the completion of an attempt whose lease was taken over
// (SQLSTATE 55000); its outcome was not stored.
var ErrLeaseLost = errors.New("the attempt lost its lease; its outcome was not stored")

// Call is one request: Operation, Key (nil: the header was missing) and
// Request (JSON text; nil for none), and the claim's options.
type Call struct {
	Operation     string
	Key           *string
	Request       []byte
	Tenant        string
	Lease         time.Duration // 0: the server's default (RunExternal: 30 s)
	Wait          time.Duration
	OnLeaseExpiry string // "unknown" (default) or "retry"
}

// Attempt is what a handler learns of its claim.
type Attempt struct {
	Key           string
	Token         string
	Attempt       int32
	RecoveryPoint string
}

// Querier is what a handler runs its statements with: the claim's
// connection (pgx) or transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...interface{}) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...interface{}) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...interface{}) pgx.Row
}

var jsonType = [2]string{"Content-Type", "application/json"}

const columns = `outcome, token, attempt, recovery_point, http_status, headers::text, body::text,
       error_code, retry_after, raw_body`

var messages = map[string]string{
	"in_progress":  "a request with this Idempotency-Key is still being processed; retry after Retry-After seconds",
	"mismatch":     "this Idempotency-Key was used for a different request",
	"unknown":      "the outcome of an earlier attempt with this Idempotency-Key is unknown; query the resource before retrying",
	"expired":      "this Idempotency-Key has expired; look the resource up by its business reference before sending the command again with a new key",
	"rate_limited": "too many new requests; send it again after Retry-After seconds, with the same Idempotency-Key",
}

// decision is a row of idem_claim; pointers are NULL where the outcome has
// none.
type decision struct {
	Outcome       string
	Token         *string
	Attempt       *int32
	RecoveryPoint *string
	HTTPStatus    *int32
	Headers       *string
	Body          *string
	ErrorCode     *string
	RetryAfter    *int32
	RawBody       []byte
}

func (d *decision) targets() []interface{} {
	return []interface{}{&d.Outcome, &d.Token, &d.Attempt, &d.RecoveryPoint, &d.HTTPStatus, &d.Headers,
		&d.Body, &d.ErrorCode, &d.RetryAfter, &d.RawBody}
}

func (d *decision) attempt(key string) Attempt {
	a := Attempt{Key: key, Token: *d.Token, Attempt: *d.Attempt}
	if d.RecoveryPoint != nil {
		a.RecoveryPoint = *d.RecoveryPoint
	}
	return a
}

func errorResponse(status int, code, message string, more ...[2]string) Response {
	body, _ := json.Marshal(map[string]string{"error_code": code, "message": message})
	return Response{Status: status, Headers: append([][2]string{jsonType}, more...), Body: body}
}

// answer is the Response to a decision other than proceed.
func answer(d *decision) (Response, error) {
	var r Response
	switch d.Outcome {
	case "replay":
		var headers [][2]string
		if d.Headers != nil && strings.HasPrefix(*d.Headers, "[") {
			if err := json.Unmarshal([]byte(*d.Headers), &headers); err != nil {
				return r, err
			}
		} else if d.Headers != nil {
			// an object: its members in jsonb's order
			dec := json.NewDecoder(strings.NewReader(*d.Headers))
			if _, err := dec.Token(); err != nil {
				return r, err
			}
			for dec.More() {
				name, err := dec.Token()
				if err != nil {
					return r, err
				}
				var value string
				if err := dec.Decode(&value); err != nil {
					return r, err
				}
				headers = append(headers, [2]string{name.(string), value})
			}
		}
		// Stored by another client of the records: a header no server may
		// send is never sent (the middleware answers 500).
		for _, h := range headers {
			if problem := headerProblem(h[0], h[1]); problem != "" {
				return r, errors.New("the stored answer cannot be replayed: " + problem)
			}
		}
		// A body stored without raw_body: jsonb's text without the
		// whitespace outside strings, as every library replays it.
		body := d.RawBody
		if body == nil && d.Body != nil {
			var compact bytes.Buffer
			if err := json.Compact(&compact, []byte(*d.Body)); err != nil {
				return r, err
			}
			body = compact.Bytes()
		}
		headers = append(headers, [2]string{"Idempotent-Replayed", "true"})
		return Response{int(*d.HTTPStatus), headers, body, "replay", true}, nil
	case "in_progress", "rate_limited":
		r = errorResponse(int(*d.HTTPStatus), *d.ErrorCode, messages[d.Outcome],
			[2]string{"Retry-After", strconv.Itoa(int(*d.RetryAfter))})
	case "mismatch", "unknown", "expired":
		r = errorResponse(int(*d.HTTPStatus), *d.ErrorCode, messages[d.Outcome])
	default:
		return r, fmt.Errorf("unexpected outcome of idem_claim: %q", d.Outcome)
	}
	r.Outcome = d.Outcome
	return r, nil
}

// checkKey is the 400 of a missing key, or of a call whose key or request
// is not UTF-8 (the server would refuse it with 22021, which says neither
// which), or nil.
func checkKey(c Call) *Response {
	if c.Key == nil {
		r := errorResponse(400, "IDEMPOTENCY_KEY_MISSING", "the Idempotency-Key header is required")
		return &r
	}
	if !utf8.ValidString(*c.Key) {
		r := errorResponse(400, "IDEMPOTENCY_KEY_INVALID", "idempotency key must be printable ASCII")
		return &r
	}
	if c.Request != nil && !utf8.Valid(c.Request) {
		r := errorResponse(400, "INVALID_REQUEST", "the request is not UTF-8")
		return &r
	}
	return nil
}

// refuse is the 400 answer to a claim that raised for the client's input
// (a bad key, a request jsonb refuses), or nil.
func refuse(err error) *Response {
	var r Response
	switch sqlState(err) {
	case "22023", "22004":
		r = errorResponse(400, "IDEMPOTENCY_KEY_INVALID", err.Error())
	case "22P02", "22P05", "22003", "22021":
		r = errorResponse(400, "INVALID_REQUEST", err.Error())
	default:
		return nil
	}
	return &r
}

// sqlState is the SQLSTATE of a driver's error (pgconn's, lib/pq's and
// others' SQLState method), or "".
func sqlState(err error) string {
	var e interface{ SQLState() string }
	if errors.As(err, &e) {
		return e.SQLState()
	}
	return ""
}

func interval(d time.Duration) string {
	return strconv.FormatInt(d.Microseconds(), 10) + " microseconds"
}

// What the server was found to offer: whether claims can go to
// idem_claim_text.
const (
	claimTextUnknown int32 = iota // not asked yet, or the question failed
	claimTextYes
	claimTextNo
)

// textState is what a runner learned of idem_claim_text, shared by every
// copy of the runner (Pgx and SQL are values): asked once, at the first
// call, then kept.
type textState struct{ v int32 }

func (s *textState) get() int32  { return atomic.LoadInt32(&s.v) }
func (s *textState) set(v int32) { atomic.StoreInt32(&s.v, v) }

// textStates: a runner's pool (or DB) and schema -> its *textState.
var textStates sync.Map

type textKey struct {
	pool   interface{}
	schema string
}

// calls is the SQL of a runner's statements: the schema that qualifies
// every function ("" for the search_path's), and what was learned of
// idem_claim_text.
type calls struct {
	prefix    string
	err       error // the schema's name cannot be sent
	claimText *textState
}

func callsOf(pool interface{}, schema string) calls {
	if strings.IndexByte(schema, 0) >= 0 {
		return calls{err: fmt.Errorf("idem: the schema %q cannot be a name: it contains NUL", schema)}
	}
	k := calls{}
	if schema != "" {
		k.prefix = `"` + strings.ReplaceAll(schema, `"`, `""`) + `".`
	}
	key := textKey{pool, schema}
	s, ok := textStates.Load(key)
	if !ok {
		s, _ = textStates.LoadOrStore(key, &textState{})
	}
	k.claimText = s.(*textState)
	return k
}

// learnSQL asks whether idem_claim_text is there for this role: an
// extension before 1.2 has none, and the role needs EXECUTE on it.
const learnSQL = "SELECT coalesce(has_function_privilege(to_regprocedure($1), 'EXECUTE'), false)"

func (k calls) learnArg() string { return k.prefix + "idem_claim_text(text, text, text, text)" }

// learn asks the server once (query runs learnSQL); an error leaves it
// unknown, asked again at the next call, the claim going to idem_claim
// meanwhile.
func (k calls) learn(query func(sql, arg string) (bool, error)) {
	if k.claimText.get() != claimTextUnknown {
		return
	}
	usable, err := query(learnSQL, k.learnArg())
	switch {
	case err != nil:
	case usable:
		k.claimText.set(claimTextYes)
	default:
		k.claimText.set(claimTextNo)
	}
}

// refused is whether err is idem_claim_text refusing a claim the server
// said it would take (EXECUTE revoked since: 42501; the function gone:
// 42883).  From then on, claims go to idem_claim.
func (k calls) refused(text bool, err error) bool {
	if s := sqlState(err); text && (s == "42501" || s == "42883") {
		k.claimText.set(claimTextNo)
		return true
	}
	return false
}

// claim is the SELECT of the claim for a call, its arguments, and whether
// it goes to idem_claim_text: a call with no option but the tenant, where
// the server offers it (the same answer and records as idem_claim, the
// request read from its text; four arguments, all given).
func (k calls) claim(c Call) (string, []interface{}, bool) {
	var request interface{}
	if c.Request != nil {
		request = string(c.Request)
	}
	args := []interface{}{c.Operation, *c.Key, request, c.Tenant}
	if k.claimText.get() == claimTextYes && c.Lease <= 0 && c.Wait <= 0 && c.OnLeaseExpiry == "" {
		return "SELECT " + columns + " FROM " + k.prefix + "idem_claim_text($1, $2, $3, $4)", args, true
	}
	sql := "SELECT " + columns + " FROM " + k.prefix + "idem_claim($1, $2, $3::jsonb, tenant => $4"
	opt := func(name, cast string, v interface{}) {
		args = append(args, v)
		sql += fmt.Sprintf(", %s => $%d%s", name, len(args), cast)
	}
	if c.Lease > 0 {
		opt("lease", "::interval", interval(c.Lease))
	}
	if c.Wait > 0 {
		opt("wait", "::interval", interval(c.Wait))
	}
	if c.OnLeaseExpiry != "" {
		opt("on_lease_expiry", "", c.OnLeaseExpiry)
	}
	return sql + ")", args, false
}

// headerProblem is why the strictest server (node:http) would refuse to
// send a header, or "": a name that is not an HTTP token, a value with a
// control character other than HTAB, DEL, or a character above U+00FF
// (bytes that are not UTF-8 included).  net/http would send CR and LF as
// spaces, a value other than the one stored.
func headerProblem(name, value string) string {
	if name == "" {
		return "an empty header name"
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return fmt.Sprintf("invalid header name %q", name)
		}
	}
	for _, r := range value {
		if r != '\t' && (r < 0x20 || r == 0x7f || r > 0xff) {
			return fmt.Sprintf("invalid character in the value of header %q", name)
		}
	}
	return ""
}

// finish is idem_complete (or idem_fail) of a Result, and its arguments.
// A header no server may send is an error before anything is stored.
func (k calls) finish(token string, r Result) (string, []interface{}, error) {
	if r.Status < 100 || r.Status > 599 {
		return "", nil, fmt.Errorf("not an HTTP status: %d", r.Status)
	}
	for _, h := range r.Headers {
		if problem := headerProblem(h[0], h[1]); problem != "" {
			return "", nil, errors.New(problem)
		}
	}
	headers, err := json.Marshal(r.Headers)
	if err != nil {
		return "", nil, err
	}
	if r.Headers == nil {
		headers = []byte("[]")
	}
	body := r.Body
	if body == nil {
		body = []byte{}
	}
	if r.Failed || r.Retryable {
		return "SELECT " + k.prefix + "idem_fail($1, $2, headers => $3::jsonb, raw_body => $4, retryable => $5)",
			[]interface{}{token, r.Status, string(headers), body, r.Retryable}, nil
	}
	var resource interface{}
	if r.ResourceID != "" {
		resource = r.ResourceID
	}
	return "SELECT " + k.prefix + "idem_complete($1, $2, headers => $3::jsonb, raw_body => $4, resource_id => $5)",
		[]interface{}{token, r.Status, string(headers), body, resource}, nil
}

func (r Result) response() Response {
	return Response{Status: r.Status, Headers: r.Headers, Body: r.Body, Outcome: "proceed"}
}

// Pgx runs calls over a pgxpool.Pool.
type Pgx struct {
	Pool *pgxpool.Pool
	// Schema is the extension's schema when it is not on the connections'
	// search_path: every function is called qualified by it
	// ("schema".idem_claim(...)).  "" calls them unqualified.
	Schema string
}

func (p Pgx) calls() calls { return callsOf(p.Pool, p.Schema) }

func (p Pgx) learn(ctx context.Context, k calls) {
	k.learn(func(sql, arg string) (usable bool, err error) {
		err = p.Pool.QueryRow(ctx, sql, arg).Scan(&usable)
		return
	})
}

// Run is one transaction.  handler runs only for a new key (or a new
// attempt), inside the claim's transaction, on its connection.  When it
// returns an error, everything rolls back and the error is returned (an
// *Error is answered by the middleware): a retry proceeds.
//
// A call with no option but Tenant goes to idem_claim_text where the
// server offers it (asked once, at the first call), else to idem_claim.
// Should idem_claim_text refuse it later (EXECUTE revoked, the function
// gone), the claim is rolled back and sent to idem_claim, as every later
// one is.
//
// An answer other than proceed is returned as soon as the claim's row
// arrives: the claim's transaction commits behind it, and its connection
// goes back to the pool only once that COMMIT is through (closed when it
// failed), so that no later call gets a connection with a transaction still
// open.  Only unknown waits for its COMMIT: that claim may itself have
// written the record unknown (it found an ended lease), and an answer is
// not sent before the write it reports is committed.
func (p Pgx) Run(ctx context.Context, c Call,
	handler func(ctx context.Context, q Querier, a Attempt) (Result, error)) (Response, error) {
	if bad := checkKey(c); bad != nil {
		return *bad, nil
	}
	k := p.calls()
	if k.err != nil {
		return Response{}, k.err
	}
	p.learn(ctx, k)
	conn, err := p.Pool.Acquire(ctx)
	if err != nil {
		return Response{}, err
	}
	open := true
	defer func() {
		if open {
			end(conn, "ROLLBACK")
		}
	}()
	var d decision
	for {
		sql, args, text := k.claim(c)
		batch := &pgx.Batch{}
		batch.Queue("BEGIN")
		batch.Queue(sql, args...)
		results := conn.SendBatch(ctx, batch)
		_, err = results.Exec()
		if err == nil {
			err = results.QueryRow().Scan(d.targets()...)
		}
		if cerr := results.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			break
		}
		if k.refused(text, err) {
			// nothing was written: rolled back, and sent to idem_claim
			if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
				return Response{}, err
			}
			continue
		}
		if r := refuse(err); r != nil {
			return *r, nil
		}
		return Response{}, err
	}
	if d.Outcome != "proceed" {
		if d.Outcome == "unknown" {
			if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
				return Response{}, err
			}
			conn.Release()
		} else {
			go end(conn, "COMMIT")
		}
		open = false
		return answer(&d)
	}
	result, err := handler(ctx, conn, d.attempt(*c.Key))
	if err != nil {
		return Response{}, err
	}
	fsql, fargs, err := k.finish(*d.Token, result)
	if err != nil {
		return Response{}, err
	}
	batch := &pgx.Batch{}
	batch.Queue(fsql, fargs...)
	batch.Queue("COMMIT")
	results := conn.SendBatch(ctx, batch)
	_, err = results.Exec()
	if err == nil {
		_, err = results.Exec()
	}
	if cerr := results.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Response{}, err
	}
	open = false
	conn.Release()
	return result.response(), nil
}

// end ends the transaction of a connection with sql (COMMIT or ROLLBACK),
// then gives the connection back to the pool, which drops it when that
// failed.  It runs under a context of its own: the request's may be what
// ended.
func end(conn *pgxpool.Conn, sql string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, sql); err != nil {
		conn.Conn().Close(ctx)
	}
	conn.Release()
}

// statements runs the external-call form's statements, each in a
// transaction of its own: over a pgxpool.Pool or a *sql.DB.
type statements interface {
	exec(ctx context.Context, sql string, args ...interface{}) error
	queryRow(ctx context.Context, sql string, args ...interface{}) interface{ Scan(...interface{}) error }
}

type pgxStatements struct{ pool *pgxpool.Pool }

func (s pgxStatements) exec(ctx context.Context, sql string, args ...interface{}) error {
	_, err := s.pool.Exec(ctx, sql, args...)
	return err
}

func (s pgxStatements) queryRow(ctx context.Context, sql string, args ...interface{}) interface {
	Scan(...interface{}) error
} {
	return s.pool.QueryRow(ctx, sql, args...)
}

// External is what an external-call handler gets: its attempt, a context
// cancelled when the lease is lost, Checkpoint and DeriveKey.
type External struct {
	Attempt
	st statements
	k  calls
}

// Checkpoint records how far the attempt got (idem_checkpoint).
func (e External) Checkpoint(ctx context.Context, point string) error {
	return e.st.exec(ctx, "SELECT "+e.k.prefix+"idem_checkpoint($1, $2)", e.Token, point)
}

// DeriveKey is idem_derive_key(key, step): the key of a downstream call.
func (e External) DeriveKey(ctx context.Context, step string) (string, error) {
	var k string
	err := e.st.queryRow(ctx, "SELECT "+e.k.prefix+"idem_derive_key($1, $2)", e.Key, step).Scan(&k)
	return k, err
}

// ErrRetryable, wrapped in a handler's error, stores the attempt as
// retryable: it failed before any side effect, and a retry runs again
// (503 with Retry-After: 1).
var ErrRetryable = errors.New("failed before any side effect")

// RunExternal is three transactions, for a side effect outside the
// database: the claim commits with a lease (c.Lease, default 30 s), extended
// every third of it while handler runs, then the result is committed.  An
// error wrapping ErrRetryable stores a retryable failure; any other error
// leaves the record processing, and once its lease ends retries answer
// unknown (409) or, with OnLeaseExpiry "retry", proceed from the last
// checkpoint.
func (p Pgx) RunExternal(ctx context.Context, c Call,
	handler func(ctx context.Context, e External) (Result, error)) (Response, error) {
	return runExternal(ctx, p.calls(), pgxStatements{p.Pool}, c, handler)
}

func runExternal(ctx context.Context, k calls, st statements, c Call,
	handler func(ctx context.Context, e External) (Result, error)) (Response, error) {
	if bad := checkKey(c); bad != nil {
		return *bad, nil
	}
	if k.err != nil {
		return Response{}, k.err
	}
	if c.Lease <= 0 {
		c.Lease = 30 * time.Second
	}
	sql, args, _ := k.claim(c) // idem_claim: a lease is given
	var d decision
	if err := st.queryRow(ctx, sql, args...).Scan(d.targets()...); err != nil {
		if r := refuse(err); r != nil {
			return *r, nil
		}
		return Response{}, err
	}
	if d.Outcome != "proceed" {
		return answer(&d)
	}
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	beat := make(chan struct{})
	go func() { // the heartbeat
		defer close(beat)
		ticker := time.NewTicker(c.Lease / 3)
		defer ticker.Stop()
		for {
			select {
			case <-done:
				return
			case <-ticker.C:
				err := st.exec(ctx, "SELECT "+k.prefix+"idem_heartbeat($1, $2::interval)", *d.Token, interval(c.Lease))
				if sqlState(err) == "55000" {
					cancel()
					return
				}
			}
		}
	}()
	result, err := handler(hctx, External{d.attempt(*c.Key), st, k})
	close(done)
	<-beat
	if errors.Is(err, ErrRetryable) {
		body, _ := json.Marshal(map[string]string{"error_code": "RETRYABLE_FAILURE", "message": err.Error()})
		result = Result{Status: 503, Headers: [][2]string{jsonType, {"Retry-After", "1"}}, Body: body, Retryable: true}
	} else if err != nil {
		return Response{}, err
	}
	fsql, fargs, err := k.finish(*d.Token, result)
	if err != nil {
		return Response{}, err
	}
	if err := st.exec(ctx, fsql, fargs...); err != nil {
		if sqlState(err) == "55000" {
			return Response{}, fmt.Errorf("%w: %v", ErrLeaseLost, err)
		}
		return Response{}, err
	}
	return result.response(), nil
}
