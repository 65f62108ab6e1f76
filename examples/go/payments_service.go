// Command payments_service: POST /payments with an Idempotency-Key, on the
// idempotency extension.
//
// A small HTTP service on the idem package (clients/go): its net/http
// middleware claims the key, runs the handler inside the claim's
// transaction, stores what it writes with the completion, and answers every
// outcome of idem_claim (README, "HTTP mapping").  What is left here is the
// business logic and the routes.
//
//	POST /payments          Idempotency-Key: <key>     {"amount": 1250, "currency": "EUR"}
//	GET  /payments/<id>
//
// Build with Debian's packages (golang-go, golang-github-jackc-pgx-v4-dev),
// whose sources live in /usr/share/gocode, in GOPATH mode, with clients/go
// as idempotency/idem in a GOPATH of its own:
//
//	mkdir -p gopath/src/idempotency && ln -s "$PWD/../../clients/go" gopath/src/idempotency/idem
//	GO111MODULE=off GOPATH="$PWD/gopath:/usr/share/gocode" go build -o payments_service .
//
// Connection settings come from libpq's environment variables, which pgx
// reads too (PGHOST, PGPORT, PGDATABASE, PGUSER, ...).
// --no-prepared-statements keeps pgx from preparing statements (its
// statement cache describes them and sends each with unnamed ones), for a
// pooler in transaction mode that does not carry prepared statements from
// one transaction to the next (pgbouncer before 1.21).  Listens on
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
	"log"
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
	"github.com/jackc/pgconn/stmtcache"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"

	"idempotency/idem"
)

const poolSize = 10

var (
	currencyPattern = regexp.MustCompile(`^[A-Z]{3}$`)
	paymentPath     = regexp.MustCompile(`^/payments/([A-Za-z0-9_]+)$`)
	digits          = regexp.MustCompile(`^[0-9]+$`)
)

// decodeJSON parses one JSON object, numbers kept as their text.
func decodeJSON(data []byte) map[string]interface{} {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v map[string]interface{}
	if dec.Decode(&v) != nil || dec.More() {
		return nil
	}
	return v
}

// check runs before the claim: what it refuses is answered, never stored.
func check(r *http.Request, body []byte) error {
	if decodeJSON(body) == nil {
		return &idem.Error{Status: 400, ErrorCode: "INVALID_JSON", Message: "the body must be a JSON object"}
	}
	if d := strings.TrimSpace(r.Header.Get("Simulate-Delay-Ms")); d != "" && !digits.MatchString(d) {
		return &idem.Error{Status: 400, ErrorCode: "INVALID_HEADER", Message: "Simulate-Delay-Ms must be an integer"}
	}
	return nil
}

// validate is the handler's own check: a failure is stored and replayed.
func validate(request map[string]interface{}) (amount int64, currency, problem string) {
	n, ok := request["amount"].(json.Number)
	if ok {
		var err error
		amount, err = strconv.ParseInt(string(n), 10, 64)
		ok = err == nil
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

func writeJSON(w http.ResponseWriter, status int, v interface{}) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func errorBody(code, message string) map[string]string {
	return map[string]string{"error_code": code, "message": message}
}

func paymentBody(id string, amount int64, currency string) map[string]interface{} {
	return map[string]interface{}{"id": id, "amount": amount, "currency": currency, "status": "created"}
}

// createPayment runs once per key, behind the middleware, inside the
// claim's transaction: a 201 is stored with idem_complete, a 400 with
// idem_fail, a 500 rolls everything back.
func createPayment(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	amount, currency, problem := validate(decodeJSON(idem.BodyFrom(ctx)))
	if problem != "" {
		writeJSON(w, 400, errorBody("VALIDATION_FAILED", problem))
		return
	}
	var id string
	if err := idem.QuerierFrom(ctx).QueryRow(ctx, `INSERT INTO payments (idempotency_key, amount, currency)
	                                                 VALUES ($1, $2, $3) RETURNING id`,
		idem.AttemptFrom(ctx).Key, amount, currency).Scan(&id); err != nil {
		log.Printf("POST /payments failed: %v", err)
		writeJSON(w, 500, errorBody("INTERNAL_ERROR", "try again"))
		return
	}
	ms, _ := strconv.Atoi(strings.TrimSpace(r.Header.Get("Simulate-Delay-Ms")))
	if ms > 10000 || ms < 0 {
		ms = 10000
	}
	time.Sleep(time.Duration(ms) * time.Millisecond)
	if strings.EqualFold(r.Header.Get("Simulate-Failure"), "true") {
		writeJSON(w, 500, errorBody("INTERNAL_ERROR", "simulated failure after the write"))
		return
	}
	w.Header().Set("Location", "/payments/"+id)
	writeJSON(w, 201, paymentBody(id, amount, currency))
}

func getPayment(pool *pgxpool.Pool, w http.ResponseWriter, r *http.Request, id string) {
	var amount int64
	var currency string
	err := pool.QueryRow(r.Context(), `SELECT id, amount, currency FROM payments WHERE id = $1`, id).
		Scan(&id, &amount, &currency)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		writeJSON(w, 404, errorBody("NOT_FOUND", "no such payment"))
	case err != nil:
		log.Printf("GET /payments/%s failed: %v", id, err)
		writeJSON(w, 500, errorBody("INTERNAL_ERROR", "try again"))
	default:
		writeJSON(w, 200, paymentBody(id, amount, currency))
	}
}

// logged records what each request got.
type logged struct {
	http.ResponseWriter
	status int
}

func (l *logged) WriteHeader(status int) { l.status = status; l.ResponseWriter.WriteHeader(status) }

func main() {
	port := flag.Int("port", 8000, "the port to listen on (0: a free one)")
	quiet := flag.Bool("quiet", false, "no access log (errors are logged all the same)")
	unprepared := flag.Bool("no-prepared-statements", false,
		"describe statements instead of preparing them (a pooler in transaction mode)")
	flag.Parse()
	log.SetFlags(0)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	config, err := pgxpool.ParseConfig("") // libpq's environment variables
	if err != nil {
		log.Fatal(err)
	}
	config.MaxConns = poolSize
	if *unprepared {
		config.ConnConfig.BuildStatementCache = func(conn *pgconn.PgConn) stmtcache.Cache {
			return stmtcache.New(conn, stmtcache.ModeDescribe, 512)
		}
	}
	pool, err := pgxpool.ConnectConfig(ctx, config)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	create := idem.Middleware(idem.Pgx{Pool: pool}, idem.Options{Operation: "payments.create", Check: check})(
		http.HandlerFunc(createPayment))
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lw := &logged{w, 200}
		path := r.URL.RequestURI()
		if m := paymentPath.FindStringSubmatch(path); r.Method == http.MethodGet && m != nil {
			getPayment(pool, lw, r, m[1])
		} else if r.Method == http.MethodPost && path == "/payments" {
			create.ServeHTTP(lw, r)
		} else {
			writeJSON(lw, 404, errorBody("NOT_FOUND", "no such resource"))
		}
		if !*quiet {
			log.Printf("%s %s %d", r.Method, path, lw.status)
		}
	})

	listener, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(*port)))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("listening on http://127.0.0.1:%d\n", listener.Addr().(*net.TCPAddr).Port)
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 30 * time.Second}
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
