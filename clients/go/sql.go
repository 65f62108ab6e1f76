package idem

import (
	"context"
	"database/sql"
)

// SQL runs calls over database/sql, with any PostgreSQL driver (pgx's
// stdlib, lib/pq).  database/sql sends one statement a round trip: BEGIN,
// the claim, the handler's statements, the completion and COMMIT for a new
// key (five), BEGIN and the claim for a retry (two: its COMMIT follows the
// answer, as in Pgx.Run).
type SQL struct {
	DB *sql.DB
	// Schema is the extension's schema when it is not on the connections'
	// search_path, as Pgx's.
	Schema string
}

func (s SQL) calls() calls { return callsOf(s.DB, s.Schema) }

// Run is one transaction, as Pgx.Run (idem_claim_text where the server
// offers it included); the handler gets the transaction.
func (s SQL) Run(ctx context.Context, c Call,
	handler func(ctx context.Context, tx *sql.Tx, a Attempt) (Result, error)) (Response, error) {
	if bad := checkKey(c); bad != nil {
		return *bad, nil
	}
	k := s.calls()
	if k.err != nil {
		return Response{}, k.err
	}
	k.learn(func(query, arg string) (usable bool, err error) {
		err = s.DB.QueryRowContext(ctx, query, arg).Scan(&usable)
		return
	})
	// The transaction is not the request's context's: database/sql would
	// roll it back when that context ends, and the COMMIT of an answer
	// runs after it.  Waiting for a connection, the claim and the
	// handler's statements are the request's.
	conn, err := s.DB.Conn(ctx)
	if err != nil {
		return Response{}, err
	}
	var tx *sql.Tx
	behind := false // the COMMIT is left to run behind the answer
	defer func() {
		if !behind {
			if tx != nil {
				tx.Rollback() // does nothing once committed
			}
			conn.Close()
		}
	}()
	var d decision
	for {
		if tx, err = conn.BeginTx(context.Background(), nil); err != nil {
			return Response{}, err
		}
		query, args, text := k.claim(c)
		err = tx.QueryRowContext(ctx, query, args...).Scan(d.targets()...)
		if err == nil {
			break
		}
		if k.refused(text, err) {
			// nothing was written: rolled back, and sent to idem_claim
			if err := tx.Rollback(); err != nil {
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
		// As Pgx.Run: the answer does not wait for the COMMIT, except
		// unknown's (that claim may have written the record unknown).
		if d.Outcome != "unknown" {
			behind = true
			go func(tx *sql.Tx) {
				tx.Commit()
				conn.Close()
			}(tx)
		} else if err := tx.Commit(); err != nil {
			return Response{}, err
		}
		return answer(&d)
	}
	result, err := handler(ctx, tx, d.attempt(*c.Key))
	if err != nil {
		return Response{}, err
	}
	fquery, fargs, err := k.finish(*d.Token, result)
	if err != nil {
		return Response{}, err
	}
	if _, err := tx.ExecContext(ctx, fquery, fargs...); err != nil {
		return Response{}, err
	}
	if err := tx.Commit(); err != nil {
		return Response{}, err
	}
	return result.response(), nil
}

type sqlStatements struct{ db *sql.DB }

func (s sqlStatements) exec(ctx context.Context, query string, args ...interface{}) error {
	_, err := s.db.ExecContext(ctx, query, args...)
	return err
}

func (s sqlStatements) queryRow(ctx context.Context, query string, args ...interface{}) interface {
	Scan(...interface{}) error
} {
	return s.db.QueryRowContext(ctx, query, args...)
}

// RunExternal is the external-call form over database/sql, as Pgx's: the
// claim commits with a lease (c.Lease, default 30 s), extended every third
// of it while handler runs, then the result commits; each statement in a
// transaction of its own, on a connection of the DB.
func (s SQL) RunExternal(ctx context.Context, c Call,
	handler func(ctx context.Context, e External) (Result, error)) (Response, error) {
	return runExternal(ctx, s.calls(), sqlStatements{s.DB}, c, handler)
}
