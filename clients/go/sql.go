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
}

// Run is one transaction, as Pgx.Run; the handler gets the transaction.
func (s SQL) Run(ctx context.Context, c Call,
	handler func(ctx context.Context, tx *sql.Tx, a Attempt) (Result, error)) (Response, error) {
	if bad := checkKey(c); bad != nil {
		return *bad, nil
	}
	query, args := claimSQL(c)
	// The transaction is not the request's context's: database/sql would
	// roll it back when that context ends, and the COMMIT of an answer
	// runs after it.  Waiting for a connection, the claim and the
	// handler's statements are the request's.
	conn, err := s.DB.Conn(ctx)
	if err != nil {
		return Response{}, err
	}
	tx, err := conn.BeginTx(context.Background(), nil)
	if err != nil {
		conn.Close()
		return Response{}, err
	}
	behind := false // the COMMIT is left to run behind the answer
	defer func() {
		if !behind {
			tx.Rollback() // does nothing once committed
			conn.Close()
		}
	}()
	var d decision
	if err := tx.QueryRowContext(ctx, query, args...).Scan(d.targets()...); err != nil {
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
			go func() {
				tx.Commit()
				conn.Close()
			}()
		} else if err := tx.Commit(); err != nil {
			return Response{}, err
		}
		return answer(&d)
	}
	result, err := handler(ctx, tx, d.attempt(*c.Key))
	if err != nil {
		return Response{}, err
	}
	fquery, fargs, err := finishSQL(*d.Token, result)
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
