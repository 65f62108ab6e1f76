package idem

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxNesting is how deep a body may nest arrays and objects (the outer one
// counts): the same limit in every library (clients/conformance.json),
// checked before any parser runs.
const MaxNesting = 512

// TooDeep is whether JSON text nests arrays and objects deeper than limit
// (brackets inside strings are not counted).
func TooDeep(text []byte, limit int) bool {
	depth, inString := 0, false
	for i := 0; i < len(text); i++ {
		switch c := text[i]; {
		case inString:
			if c == '\\' {
				i++
			} else if c == '"' {
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			if depth > limit {
				return true
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return false
}

// Runner is Pgx or SQL with the handler type of the middleware: the claim's
// Querier is in the request's context (QuerierFrom, or TxFrom for SQL).
type Runner interface {
	runHTTP(ctx context.Context, c Call, h func(ctx context.Context) (Result, error)) (Response, error)
}

type ctxKey int

const (
	querierKey ctxKey = iota
	txKey
	attemptKey
	bodyKey
)

func (p Pgx) runHTTP(ctx context.Context, c Call, h func(context.Context) (Result, error)) (Response, error) {
	return p.Run(ctx, c, func(ctx context.Context, q Querier, a Attempt) (Result, error) {
		return h(context.WithValue(context.WithValue(ctx, querierKey, q), attemptKey, a))
	})
}

func (s SQL) runHTTP(ctx context.Context, c Call, h func(context.Context) (Result, error)) (Response, error) {
	return s.Run(ctx, c, func(ctx context.Context, tx *sql.Tx, a Attempt) (Result, error) {
		return h(context.WithValue(context.WithValue(ctx, txKey, tx), attemptKey, a))
	})
}

// QuerierFrom is the claim's connection, inside a handler behind the
// middleware over Pgx.
func QuerierFrom(ctx context.Context) Querier { q, _ := ctx.Value(querierKey).(Querier); return q }

// TxFrom is the claim's transaction, inside a handler behind the middleware
// over SQL.
func TxFrom(ctx context.Context) *sql.Tx { tx, _ := ctx.Value(txKey).(*sql.Tx); return tx }

// AttemptFrom is the claim's attempt, inside a handler behind the middleware.
func AttemptFrom(ctx context.Context) Attempt { a, _ := ctx.Value(attemptKey).(Attempt); return a }

// BodyFrom is the request's body as read by the middleware (r.Body is
// empty behind it).
func BodyFrom(ctx context.Context) []byte { b, _ := ctx.Value(bodyKey).([]byte); return b }

// Options of the middleware.  Operation is required.  Check runs before the
// claim: an *Error it returns is answered and nothing is stored.  Tenant
// gives the tenant of a request.  MaxBody bounds the body (default 1 MiB).
type Options struct {
	Operation string
	Check     func(r *http.Request, body []byte) error
	Tenant    func(r *http.Request) string
	MaxBody   int64
	Call      Call // further claim options (Lease, Wait, OnLeaseExpiry)
}

// Middleware runs next once per Idempotency-Key, inside the claim's
// transaction, and stores what it writes: a status below 400 with
// idem_complete, 4xx with idem_fail (replayed), 5xx not at all (the
// transaction rolls back; a retry runs again).  The request's JSON body is
// the fingerprint's request.  next finds the claim's connection with
// QuerierFrom (or TxFrom) and the body with BodyFrom.
func Middleware(run Runner, opts Options) func(http.Handler) http.Handler {
	maxBody := opts.MaxBody
	if maxBody <= 0 {
		maxBody = 1 << 20
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			response, err := serve(run, opts, maxBody, next, r)
			if e, ok := err.(*Error); ok {
				response, err = e.Response(), nil
			}
			if err != nil { // the transaction rolled back: a retry proceeds
				log.Printf("%s %s failed: %v", r.Method, r.URL.RequestURI(), err)
				response = errorResponse(500, "INTERNAL_ERROR", "the request failed; try again")
			}
			Write(w, response)
		})
	}
}

func serve(run Runner, opts Options, maxBody int64, next http.Handler, r *http.Request) (Response, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return Response{}, err
	}
	if int64(len(body)) > maxBody {
		return Response{}, &Error{413, "BODY_TOO_LARGE", "the body is too large"}
	}
	if TooDeep(body, MaxNesting) {
		return Response{}, &Error{400, "JSON_TOO_DEEP",
			"the body nests arrays and objects more than " + strconv.Itoa(MaxNesting) + " deep"}
	}
	// JSON is UTF-8: bytes that are not are the client's bad request (the
	// server would refuse them with 22021).
	if len(body) > 0 && (!utf8.Valid(body) || !json.Valid(body)) {
		return Response{}, &Error{400, "INVALID_JSON", "the body is not valid JSON"}
	}
	if opts.Check != nil {
		if err := opts.Check(r, body); err != nil {
			return Response{}, err
		}
	}
	c := opts.Call
	c.Operation = opts.Operation
	// The header holds one key: two lines, or a comma in the value (HTTP
	// lets a proxy join two lines so), are the client's bad key.
	if keys, ok := r.Header["Idempotency-Key"]; ok {
		if len(keys) > 1 || strings.Contains(keys[0], ",") {
			return Response{}, &Error{400, "IDEMPOTENCY_KEY_INVALID", "send one Idempotency-Key header, holding one key (no comma)"}
		}
		c.Key = &keys[0]
	}
	if len(body) > 0 {
		c.Request = body
	}
	if opts.Tenant != nil {
		c.Tenant = opts.Tenant(r)
	}
	return run.runHTTP(r.Context(), c, func(ctx context.Context) (Result, error) {
		rec := &recorder{header: http.Header{}, status: 200}
		next.ServeHTTP(rec, r.WithContext(context.WithValue(ctx, bodyKey, body)))
		if rec.status >= 500 {
			return Result{}, &Error{rec.status, "INTERNAL_ERROR", "the request failed; try again"}
		}
		return Result{Status: rec.status, Headers: rec.pairs(), Body: rec.body.Bytes(),
			Failed: rec.status >= 400}, nil
	})
}

// Write sends a Response: its header pairs in order, and Content-Length.
func Write(w http.ResponseWriter, r Response) {
	for _, h := range r.Headers {
		w.Header().Add(h[0], h[1])
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(r.Body)))
	w.WriteHeader(r.Status)
	w.Write(r.Body)
}

// recorder keeps what next writes, to store it before it is sent.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
	wrote  bool
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if !r.wrote {
		r.status, r.wrote = status, true
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(200)
	return r.body.Write(b)
}

// pairs are the headers written, by name (an http.Header keeps no order
// between names), each name's values in order; Content-Type as
// net/http would send it when next set none.
func (r *recorder) pairs() [][2]string {
	var out [][2]string
	names := make([]string, 0, len(r.header))
	for name := range r.header {
		names = append(names, name)
	}
	sort.Strings(names)
	if _, ok := r.header["Content-Type"]; !ok && r.body.Len() > 0 {
		out = append(out, [2]string{"Content-Type", http.DetectContentType(r.body.Bytes())})
	}
	for _, name := range names {
		if name == "Content-Length" {
			continue
		}
		for _, v := range r.header[name] {
			out = append(out, [2]string{name, v})
		}
	}
	return out
}
