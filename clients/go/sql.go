package idem

import (
	"context"
	"database/sql"
)

// SQL runs calls over database/sql, with any PostgreSQL driver (pgx's
// stdlib, lib/pq).  database/sql sends one statement a round trip: BEGIN,
// the claim, the handler's statements, the completion and COMMIT.
type SQL struct {
	DB *sql.DB
}

// Run is one transaction, as Pgx.Run; the handler gets the transaction.
func (s SQL) Run(ctx context.Context, c Call,
	handler func(ctx context.Context, tx *sql.Tx, a Attempt) (Result, error)) (Response, error) {
	if bad := checkKey(c.Key); bad != nil {
		return *bad, nil
	}
	query, args := claimSQL(c)
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return Response{}, err
	}
	defer tx.Rollback() // does nothing once committed
	var d decision
	if err := tx.QueryRowContext(ctx, query, args...).Scan(d.targets()...); err != nil {
		if r := refuse(err); r != nil {
			return *r, nil
		}
		return Response{}, err
	}
	if d.Outcome != "proceed" {
		// a claim that found an ended lease may have made the record unknown
		if err := tx.Commit(); err != nil {
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
