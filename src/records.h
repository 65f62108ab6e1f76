/*-------------------------------------------------------------------------
 *
 * records.h
 *	  Reading and writing idem_records through prepared SPI plans.
 *
 * Every function here must be called between SPI_connect and SPI_finish.
 * Values returned are allocated in the caller's memory context (the one
 * current before SPI_connect), so they survive SPI_finish.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_RECORDS_H
#define IDEM_RECORDS_H

#include "canonical.h"
#include "datatype/timestamp.h"
#include "state_machine.h"
#include "utils/jsonb.h"

#define IDEM_TOKEN_SECRET_LEN 16

/* idempotency.cleanup_action */
typedef enum IdemCleanupAction
{
	IDEM_CLEANUP_DELETE,
	IDEM_CLEANUP_ARCHIVE
} IdemCleanupAction;

/*
 * idempotency.synchronous_outcomes, idempotency.tombstone_ttl,
 * idempotency.cleanup_action
 */
extern bool idem_synchronous_outcomes;
extern int	idem_tombstone_ttl_s;
extern int	idem_cleanup_action;

extern void idem_records_init(void);

/*
 * The scope and key of a record.  role is the database role that called the
 * function (idem_calling_role), never an argument: it keeps roles apart.
 * In a record read back it is InvalidOid when the record's role is gone.
 */
typedef struct IdemScope
{
	Oid			role;
	text	   *tenant;
	text	   *caller;
	text	   *operation;
	text	   *key;
} IdemScope;

/* One record, as read from the table. */
typedef struct IdemRecord
{
	int64		id;
	IdemState	state;
	int32		attempt;
	uint8		fingerprint[IDEM_FINGERPRINT_LEN];
	text	   *recovery_point;		/* NULL when none */
	bool		has_lease;
	TimestampTz locked_until;
	IdemLeasePolicy on_lease_expiry;
	bool		has_response_status;
	int32		response_status;
	Jsonb	   *response_headers;	/* NULL when none */
	Jsonb	   *response_body;	/* NULL when none */
	bytea	   *response_raw_body;	/* NULL when none; may be empty */
	bytea	   *response_sealed;	/* encrypted headers and bodies, until
									 * idem_record_open_response */
	text	   *resource_id;	/* NULL when none */
	TimestampTz expires_at;
	/* the transaction that changed or locked this version, if any */
	TransactionId writer_xid;
	/* scope, filled by idem_record_fetch_by_id only */
	IdemScope	scope;
} IdemRecord;

/* A new attempt to write: what idem_claim asks for. */
typedef struct IdemAttemptStart
{
	uint8		fingerprint[IDEM_FINGERPRINT_LEN];
	uint8		secret[IDEM_TOKEN_SECRET_LEN];
	TimestampTz now;
	TimestampTz locked_until;
	TimestampTz expires_at;
	Interval   *ttl;
	IdemLeasePolicy on_lease_expiry;
	bool		finished;		/* an inbox record: succeeded at once, no
								 * token, lease or response */
} IdemAttemptStart;

/* The answer an attempt or an operator stores. */
typedef struct IdemResponse
{
	IdemState	state;
	int32		http_status;
	Jsonb	   *headers;		/* NULL when none */
	Jsonb	   *body;			/* NULL when none */
	bytea	   *raw_body;		/* NULL when none; may be empty */
	text	   *resource_id;	/* NULL when none */
} IdemResponse;

/*
 * The attempt a token names, and the role using it: a token only works on
 * a record of the role that uses it.
 */
typedef struct IdemToken
{
	int64		record_id;
	int32		attempt;
	uint8		secret[IDEM_TOKEN_SECRET_LEN];
	Oid			role;			/* set by the caller, not by the parser */
} IdemToken;

extern bool idem_record_fetch(const IdemScope *scope, IdemRecord *rec);
extern bool idem_record_fetch_latest(const IdemScope *scope, IdemRecord *rec);
extern void idem_record_open_response(IdemRecord *rec);
extern bool idem_record_fetch_by_id(int64 id, Oid role, bool any_role,
									IdemRecord *rec);
extern bool idem_record_insert(const IdemScope *scope,
							   const IdemAttemptStart *start, int64 *id,
							   TransactionId *writer);
extern bool idem_record_claim_unwritten(const IdemScope *scope, int64 *id,
										TransactionId *writer);
extern void idem_record_write_claimed(const IdemScope *scope,
									  const IdemAttemptStart *start, int64 id,
									  const IdemResponse *response,
									  TimestampTz now);
extern bool idem_record_restart(IdemRecord *rec, bool reuse,
								const IdemAttemptStart *start);
extern bool idem_record_mark_unknown(const IdemRecord *rec, TimestampTz now);
extern bool idem_record_finish(const IdemToken *token,
							   const IdemResponse *response, TimestampTz now,
							   text **operation);
extern bool idem_record_extend_lease(const IdemToken *token,
									 TimestampTz locked_until, TimestampTz now);
extern bool idem_record_set_recovery_point(const IdemToken *token,
										   text *recovery_point,
										   TimestampTz now);
extern bool idem_record_resolve(int64 id, Oid role, bool any_role,
								const IdemResponse *response, TimestampTz now);

#endif							/* IDEM_RECORDS_H */
