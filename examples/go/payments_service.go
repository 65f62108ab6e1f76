// Command payments_service: POST /payments with an Idempotency-Key, on the
// idempotency extension.
//
// A small HTTP service (net/http, pgx v4) that shows the one-transaction
// pattern: the claim, the business write (a row in payments) and
// idem_complete commit together, and every outcome of idem_claim becomes its
// HTTP answer (README, "HTTP mapping").
//
//	POST /payments          Idempotency-Key: <key>     {"amount": 1250, "currency": "EUR"}
//	GET  /payments/<id>
//
// Build with Debian's packages (golang-go, golang-github-jackc-pgx-v4-dev),
// whose sources live in /usr/share/gocode, in GOPATH mode:
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o payments_service .
//
// Connection settings come from libpq's environment variables, which pgx
// reads too (PGHOST, PGPORT, PGDATABASE, PGUSER, ...).  Listens on
// 127.0.0.1; `--port 0` picks a free port.  The first line on stdout is
// "listening on http://127.0.0.1:PORT".
//
// For tests, two request headers that are not part of the request (and so
// not of its fingerprint) make the handler misbehave:
//
//	Simulate-Delay-Ms: N      the handler sleeps N ms (at most 10000) after
//	                          its write, inside the transaction
//	Simulate-Failure: true    the handler fails after its write: the
//	                          transaction rolls back and the claim with it
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

const (
	operation = "payments.create"
	poolSize  = 10
	maxBody   = 1 << 20
)

const claimSQL = `
    SELECT outcome, token, http_status, headers, raw_body, error_code, retry_after
      FROM idem_claim($1, $2, $3::jsonb)`

var (
	currencyPattern = regexp.MustCompile(`^[A-Z]{3}$`)
	paymentPath     = regexp.MustCompile(`^/payments/([A-Za-z0-9_]+)$`)
)

// An HTTP answer: status, headers as [name, value] pairs (in order, repeats
// kept) and the body's bytes.  The stored response is exactly what was
// sent, so a replay sends the same bytes.
type answer struct {
	status  int
	headers [][2]string
	body    []byte
}

var jsonType = [2]string{"Content-Type", "application/json"}

// jsonAnswer is a JSON answer with Content-Type and any further headers.
func jsonAnswer(status int, body interface{}, more ...[2]string) (answer, error) {
	data, err := encodeJSON(body)
	if err != nil {
		return answer{}, err
	}
	return answer{status, append([][2]string{jsonType}, more...), data}, nil
}

type clientError struct {
	status    int
	errorCode string
	message   string
}

func (e *clientError) Error() string { return e.message }

func errorBody(code, message string) map[string]interface{} {
	return map[string]interface{}{"error_code": code, "message": message}
}

// A row of idem_claim; the columns are NULL where the outcome has none.
type decision struct {
	Outcome    string
	Token      *string
	HTTPStatus *int32
	Headers    []byte // jsonb: [name, value] pairs
	RawBody    []byte // bytea
	ErrorCode  *string
	RetryAfter *int32
}

// decodeJSON parses one JSON value, numbers kept as their text
// (json.Number), and nothing after it.
func decodeJSON(data []byte, v interface{}) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

// encodeJSON writes a JSON value compactly (encoding/json sorts map keys;
// replays need nothing of it, since the response is stored as the bytes
// sent).
func encodeJSON(v interface{}) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// validate is the handler's own check: a failure is stored and replayed.
func validate(request map[string]interface{}) (amount int64, currency, problem string) {
	n, ok := request["amount"].(json.Number)
	if ok {
		amount, ok = parseInt(string(n))
	}
	if !ok || amount <= 0 {
		return 0, "", "amount must be a positive integer (minor units)"
	}
	currency, ok = request["currency"].(string)
	if !ok || !currencyPattern.MatchString(currency) {
		return 0, "", "currency must be a three-letter ISO 4217 code"
	}
	return amount, currency, ""
}

func parseInt(s string) (int64, bool) {
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil
}

// answerFor maps an outcome other than proceed to its answer.
func answerFor(d *decision) (answer, error) {
	code := ""
	if d.ErrorCode != nil {
		code = *d.ErrorCode
	}
	switch d.Outcome {
	case "replay":
		// The stored status, headers and body bytes, exactly as first
		// sent, and the marker.
		var headers [][2]string
		if d.Headers != nil {
			if err := json.Unmarshal(d.Headers, &headers); err != nil {
				return answer{}, err
			}
		}
		headers = append(headers, [2]string{"Idempotent-Replayed", "true"})
		return answer{int(*d.HTTPStatus), headers, d.RawBody}, nil
	case "in_progress":
		return jsonAnswer(409, errorBody(code, "a request with this Idempotency-Key is still being processed"),
			[2]string{"Retry-After", strconv.Itoa(int(*d.RetryAfter))})
	case "mismatch":
		return jsonAnswer(422, errorBody(code, "this Idempotency-Key was used for a different request"))
	case "unknown":
		return jsonAnswer(409, errorBody(code, "the outcome of the first attempt is unknown; query the payment before retrying"))
	case "expired":
		return jsonAnswer(409, errorBody(code, "this Idempotency-Key has expired; look the payment up by its reference before sending it again with a new key"))
	case "rate_limited":
		// Nothing was written: the same request, same key, may come again.
		return jsonAnswer(429, errorBody(code, "too many new requests from this client; send it again after Retry-After seconds, with the same Idempotency-Key"),
			[2]string{"Retry-After", strconv.Itoa(int(*d.RetryAfter))})
	}
	return answer{}, fmt.Errorf("unexpected outcome %q", d.Outcome)
}

// inTransaction runs work in one transaction: it commits when work returns
// no error and rolls back otherwise.  The answer is returned only once the
// commit succeeded.  It waits 30 s at most for a free connection.
func inTransaction(ctx context.Context, pool *pgxpool.Pool, work func(pgx.Tx) (answer, error)) (answer, error) {
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	conn, err := pool.Acquire(waitCtx)
	cancel()
	if err != nil {
		return answer{}, err
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return answer{}, err
	}
	defer tx.Rollback(ctx) // does nothing once committed
	result, err := work(tx)
	if err != nil {
		return answer{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return answer{}, err
	}
	return result, nil
}

// createPayment: claim, write, complete, in one transaction.
func createPayment(ctx context.Context, pool *pgxpool.Pool, key string, request map[string]interface{},
	delay time.Duration, fail bool) (answer, error) {
	reqJSON, err := encodeJSON(request)
	if err != nil {
		return answer{}, err
	}
	return inTransaction(ctx, pool, func(tx pgx.Tx) (answer, error) {
		var d decision
		err := tx.QueryRow(ctx, claimSQL, operation, key, string(reqJSON)).
			Scan(&d.Outcome, &d.Token, &d.HTTPStatus, &d.Headers, &d.RawBody, &d.ErrorCode, &d.RetryAfter)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "22023" || pgErr.Code == "22004") {
			// A bad key (invalid_parameter_value, null_value_not_allowed):
			// the client sent it.
			return answer{}, &clientError{400, "IDEMPOTENCY_KEY_INVALID", pgErr.Message}
		} else if err != nil {
			return answer{}, err
		}
		if d.Outcome != "proceed" {
			// Commit all the same: a claim that found an ended lease may
			// have moved the record to unknown.
			return answerFor(&d)
		}
		amount, currency, problem := validate(request)
		if problem != "" {
			// A stable failure: stored, replayed to every retry.
			a, err := jsonAnswer(400, errorBody("VALIDATION_FAILED", problem))
			if err != nil {
				return answer{}, err
			}
			if err := store(ctx, tx, `SELECT idem_fail($1, 400, headers => $2::jsonb, raw_body => $3)`,
				*d.Token, a); err != nil {
				return answer{}, err
			}
			return a, nil
		}
		var id string
		if err := tx.QueryRow(ctx, `INSERT INTO payments (idempotency_key, amount, currency)
		                             VALUES ($1, $2, $3) RETURNING id`, key, amount, currency).Scan(&id); err != nil {
			return answer{}, err
		}
		if delay > 0 {
			time.Sleep(delay)
		}
		if fail {
			return answer{}, errors.New("simulated failure after the write")
		}
		a, err := jsonAnswer(201, paymentBody(id, amount, currency), [2]string{"Location", "/payments/" + id})
		if err != nil {
			return answer{}, err
		}
		if err := store(ctx, tx, `SELECT idem_complete($1, 201, headers => $2::jsonb, raw_body => $3,
		                                           resource_id => $4)`, *d.Token, a, id); err != nil {
			return answer{}, err
		}
		return a, nil
	})
}

// store runs idem_complete or idem_fail with the token, the answer's
// headers (as a JSON list of pairs) and body bytes, and any further
// arguments.
func store(ctx context.Context, tx pgx.Tx, sql, token string, a answer, more ...interface{}) error {
	headers, err := json.Marshal(a.headers)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, sql, append([]interface{}{token, string(headers), a.body}, more...)...)
	return err
}

func paymentBody(id string, amount int64, currency string) map[string]interface{} {
	return map[string]interface{}{"id": id, "amount": amount, "currency": currency, "status": "created"}
}

func getPayment(ctx context.Context, pool *pgxpool.Pool, id string) (answer, error) {
	return inTransaction(ctx, pool, func(tx pgx.Tx) (answer, error) {
		var amount int64
		var currency string
		err := tx.QueryRow(ctx, `SELECT id, amount, currency FROM payments WHERE id = $1`, id).
			Scan(&id, &amount, &currency)
		if errors.Is(err, pgx.ErrNoRows) {
			return jsonAnswer(404, errorBody("NOT_FOUND", "no such payment"))
		} else if err != nil {
			return answer{}, err
		}
		return jsonAnswer(200, paymentBody(id, amount, currency))
	})
}

type server struct {
	pool    *pgxpool.Pool
	verbose bool
}

func (s *server) route(r *http.Request) (answer, error) {
	path := r.URL.RequestURI()
	if r.Method == http.MethodPost && path == "/payments" {
		keys, ok := r.Header["Idempotency-Key"]
		if !ok {
			return answer{}, &clientError{400, "IDEMPOTENCY_KEY_MISSING", "the Idempotency-Key header is required"}
		}
		data, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
		if err != nil {
			return answer{}, err
		}
		if len(data) > maxBody {
			return answer{}, &clientError{413, "BODY_TOO_LARGE", "the body is too large"}
		}
		var request map[string]interface{}
		if decodeJSON(data, &request) != nil || request == nil {
			return answer{}, &clientError{400, "INVALID_JSON", "the body must be a JSON object"}
		}
		delay := strings.TrimSpace(r.Header.Get("Simulate-Delay-Ms"))
		if delay == "" {
			delay = "0"
		}
		ms, ok := new(big.Int).SetString(delay, 10)
		if !ok {
			return answer{}, &clientError{400, "INVALID_HEADER", "Simulate-Delay-Ms must be an integer"}
		}
		if ms.Sign() < 0 {
			ms.SetInt64(0)
		} else if ms.Cmp(big.NewInt(10000)) > 0 {
			ms.SetInt64(10000)
		}
		fail := strings.EqualFold(r.Header.Get("Simulate-Failure"), "true")
		return createPayment(r.Context(), s.pool, keys[0], request, time.Duration(ms.Int64())*time.Millisecond, fail)
	}
	if m := paymentPath.FindStringSubmatch(path); r.Method == http.MethodGet && m != nil {
		return getPayment(r.Context(), s.pool, m[1])
	}
	return answer{}, &clientError{404, "NOT_FOUND", "no such resource"}
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	result, err := s.route(r)
	var ce *clientError
	if errors.As(err, &ce) {
		result, err = jsonAnswer(ce.status, errorBody(ce.errorCode, ce.message))
	} else if err != nil { // the transaction rolled back: a retry proceeds
		log.Printf("%s %s failed: %v", r.Method, r.URL.RequestURI(), err)
		result, err = jsonAnswer(500, errorBody("INTERNAL_ERROR", "try again"))
	}
	if err != nil {
		result = answer{status: 500}
	}
	for _, h := range result.headers {
		w.Header().Add(h[0], h[1])
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(result.body)))
	w.WriteHeader(result.status)
	w.Write(result.body)
	if s.verbose {
		log.Printf("%s %s %d", r.Method, r.URL.RequestURI(), result.status)
	}
}

func main() {
	port := flag.Int("port", 8000, "the port to listen on (0: a free one)")
	quiet := flag.Bool("quiet", false, "no access log (errors are logged all the same)")
	flag.Parse()
	log.SetFlags(0)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	config, err := pgxpool.ParseConfig("") // libpq's environment variables
	if err != nil {
		log.Fatal(err)
	}
	config.MaxConns = poolSize
	pool, err := pgxpool.ConnectConfig(ctx, config)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	listener, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(*port)))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("listening on http://127.0.0.1:%d\n", listener.Addr().(*net.TCPAddr).Port)
	srv := &http.Server{Handler: &server{pool, !*quiet}, ReadHeaderTimeout: 30 * time.Second}
	stopped := make(chan struct{})
	go func() { // on SIGTERM, let the running requests end (5 s at most)
		defer close(stopped)
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(listener); err != http.ErrServerClosed {
		log.Fatal(err)
	}
	<-stopped
}
