/*-------------------------------------------------------------------------
 *
 * records.c
 *	  Reads and writes of idem_records.  The read every claim and replay
 *	  starts with probes the unique index directly; a claim's insert and
 *	  every write with an attempt token (complete, fail, heartbeat,
 *	  checkpoint) go through record_writer.c, without a statement; the
 *	  rarer writes (new attempts, marking a lease unknown, resolving) and
 *	  the lookup by id are prepared SPI plans kept for the life of the
 *	  backend.
 *
 * Every write is conditional on the exact version it expects (state,
 * attempt, and for attempt writes the token's secret), checked on the row
 * it locked, so a write based on a stale read changes nothing and the
 * caller finds out.  Claim writes skip rows locked by others (FOR UPDATE
 * SKIP LOCKED), so that a claim never waits for another transaction's row
 * lock: a row that is being written by someone else is simply not
 * updated.  A claim's insert first looks for a record of its key committed
 * since its read.
 *
 * When a key is free.  A claim answers proceed for a new key only when no
 * transaction, committed or not ended, holds a record of its scope and key,
 * and key_held is the one place that decides it, for the insert and for
 * the claim written at its completion alike, from three things in this
 * order.  The key lock (key_lock.c), which every claim that begins a record
 * of a key takes: no new record of the key can begin meanwhile.  A probe of
 * the unique index under a dirty snapshot: it finds a record that a
 * transaction that has not ended is inserting, updating or deleting, and
 * names that transaction to wait for.  And, when the probe met entries of
 * the key whose rows it did not see, a read under a snapshot taken after
 * the probe: it finds every record committed before the probe ended.
 * The probe alone is not enough.  An index scan reads a leaf page's entries
 * first and checks their rows afterwards; a transaction that updates the
 * record and commits in between (a completion, a heartbeat, the worker)
 * leaves the probe only the version it replaced, dead, while the new
 * version's entry was added to the page after it was read.  That
 * transaction committed before the probe ended, so the later snapshot sees
 * the new version, through the entry it added before it committed, as a
 * dead version replaced by a committed update means: the key exists.
 * Writers of existing records therefore need no lock of their own: they
 * change versions of a record that the two reads between them always
 * find.  Only beginning a record of a key takes the key lock.
 *
 * Every read and write is confined to the calling role's records (the role
 * column, first in the unique index); only idem_resolve by an operator
 * reaches other roles' records.
 *
 * Everything here runs as the owner of idem_records (security.c), so
 * nothing in the statements may depend on search_path: the table is named
 * with the schema the extension lives in, every operator is written
 * OPERATOR(pg_catalog.x), and every value, enum labels included, is a typed
 * parameter, never a literal whose type is looked up by name and never
 * text pasted into the SQL.  A function, operator or table a user creates
 * in another schema, or a search_path that puts it first, cannot change
 * what these statements do; when search_path changes, the plan cache
 * parses them again and they bind to the same objects.  When the table is
 * replaced (DROP and CREATE EXTENSION) catalog.c hands out a new
 * generation number and the plans are prepared again.
 *
 * With idempotency.cleanup_action = 'archive', a claim that reuses an
 * expired record for a new command first copies the record, as it was, to
 * idem_records_archive, in the statement that reuses it and by the rules of
 * the cleanup passes (maintenance.c): once per command (no copy when the
 * archive holds one with the same id and claimed_at), and never a reuse
 * without its copy: when the archive is missing the claim ends with an
 * error and the record stays as it was.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "catalog.h"
#include "pg_compat.h"
#include "record_writer.h"
#include "records_guard.h"
#include "records.h"
#include "security.h"
#include "response_seal.h"
#include "test_pause.h"

int			idem_tombstone_ttl_s = 7 * 24 * 60 * 60;
int			idem_cleanup_action = IDEM_CLEANUP_DELETE;
bool		idem_synchronous_outcomes = true;

static const struct config_enum_entry cleanup_action_options[] = {
	{"delete", IDEM_CLEANUP_DELETE, false},
	{"archive", IDEM_CLEANUP_ARCHIVE, false},
	{NULL, 0, false}
};

typedef enum RecordPlan
{
	PLAN_FETCH_BY_ID,
	PLAN_RESTART,
	PLAN_RESTART_ARCHIVE,
	PLAN_MARK_UNKNOWN,
	PLAN_RESOLVE,
	NUM_RECORD_PLANS
} RecordPlan;

/* The columns read_record decodes, in this order. */
#define RECORD_COLUMN_COUNT 12
#define RECORD_COLUMNS \
	"id, state, attempt, fingerprint, recovery_point, locked_until, " \
	"on_lease_expiry, response_status, response_headers, response_body, " \
	"resource_id, expires_at"

/* The columns of idem_records that the reads and direct writes use. */
typedef enum RecordColumn
{
	COL_ID,
	COL_ROLE,
	COL_TENANT,
	COL_CALLER,
	COL_OPERATION,
	COL_KEY,
	COL_FINGERPRINT,
	COL_STATE,
	COL_ATTEMPT,
	COL_ATTEMPT_TOKEN,
	COL_RECOVERY_POINT,
	COL_LOCKED_UNTIL,
	COL_ON_LEASE_EXPIRY,
	COL_TTL,
	COL_RESPONSE_STATUS,
	COL_RESPONSE_HEADERS,
	COL_RESPONSE_BODY,
	COL_RESOURCE_ID,
	COL_CREATED_AT,
	COL_CLAIMED_AT,
	COL_UPDATED_AT,
	COL_COMPLETED_AT,
	COL_EXPIRES_AT,
	/* version 1.1: InvalidAttrNumber while the table is still 1.0's */
	COL_RESPONSE_RAW_BODY,
	COL_RESPONSE_SEALED,
	NUM_RECORD_COLUMNS
} RecordColumn;

/* The first of the columns that a table of version 1.0 lacks. */
#define FIRST_OPTIONAL_COLUMN COL_RESPONSE_RAW_BODY

/* RECORD_COLUMNS, the columns read_record decodes, as RecordColumns. */
static const RecordColumn record_columns[RECORD_COLUMN_COUNT] = {
	COL_ID, COL_STATE, COL_ATTEMPT, COL_FINGERPRINT, COL_RECOVERY_POINT,
	COL_LOCKED_UNTIL, COL_ON_LEASE_EXPIRY, COL_RESPONSE_STATUS,
	COL_RESPONSE_HEADERS, COL_RESPONSE_BODY, COL_RESOURCE_ID, COL_EXPIRES_AT
};

/* Operators of pg_catalog, whatever the search_path says. */
#define EQ " OPERATOR(pg_catalog.=) "
#define LE " OPERATOR(pg_catalog.<=) "
#define PLUS " OPERATOR(pg_catalog.+) "

static SPIPlanPtr plans[NUM_RECORD_PLANS];
static uint64 plans_generation = 0;
static bool plans_exact = false;	/* prepared for a table of 1.1 */
static uint64 plans_layout_generation = 0;
static bool plans_layout_exact = false;

static bool fetch_record(const IdemScope *scope, IdemRecord *rec, bool latest);
static TransactionId version_writer(TupleTableSlot *slot);
static SPIPlanPtr get_plan(RecordPlan which);
static Oid	role_column_type(const IdemCatalog *cat);
static SPIPlanPtr prepare_plan(RecordPlan which, const IdemCatalog *cat,
							   bool exact);
static bool plans_for_exact_responses(void);
static void require_exact_columns(bool exact, const IdemResponse *response);
static void set_response(Datum *values, bool *nulls, const AttrNumber *col,
						 int64 id, const IdemResponse *response);
static void *optional_column(TupleTableSlot *slot, AttrNumber attnum);
static int	run_plan(RecordPlan which, Datum *values, const char *nulls);
static bool reuse_needs_archive(void);
static int	run_plan_once(RecordPlan which, Datum *values, const char *nulls);
static void scope_keys(const IdemScope *scope, ScanKey keys);
static bool key_held(Relation heap, Relation index, const IdemScope *scope,
					 TupleTableSlot *slot, TransactionId *writer);
static bool key_being_written(Relation heap, Relation index, ScanKey keys,
							  TupleTableSlot *slot, TransactionId *writer,
							  bool *saw_entries);
static void refuse_claimed_since_snapshot(TransactionId writer);
static bool scope_scan(Relation heap, const IdemScope *scope,
					   Snapshot snapshot, TupleTableSlot *slot);
static bool scan_key(Relation heap, Relation index, ScanKey keys,
					 Snapshot snapshot, TupleTableSlot *slot);
static void insert_row(IdemRecordWriter *w, const IdemScope *scope,
					   const IdemAttemptStart *start, int64 id,
					   const IdemResponse *response, TimestampTz now);
static void write_new_row(IdemRecordWriter *w, const IdemScope *scope,
						  int64 id);
static bool row_is_claimed(TupleTableSlot *slot, Relation heap,
						   const IdemScope *scope, int64 id);
pg_noreturn static void refuse_changed_row(void);
static void outcome_written(void);
static bool lock_token_attempt(IdemRecordWriter *w, const IdemToken *token);
static bool token_owns_row(TupleTableSlot *slot, const AttrNumber *col,
						   const IdemToken *token);
static bool token_write(const IdemToken *token, RecordColumn column,
						Datum value, TimestampTz now);
static const AttrNumber *column_attnums(Relation heap);
static void set_column(Datum *values, bool *nulls, AttrNumber attnum,
					   Datum value);
static void set_nullable(Datum *values, bool *nulls, AttrNumber attnum,
						 void *pointer);
static void read_record(const Datum *values, const bool *nulls, IdemRecord *rec,
						MemoryContext into);
static void read_spi_row(IdemRecord *rec, bool with_scope, MemoryContext into);
static void *copy_out(Datum value, MemoryContext into);
static Datum bytes_datum(const uint8 *bytes, int len);
static Datum nullable(void *pointer, char *null);

/*
 * Read the record of a scope and key.  Returns false when there is none.
 *
 * This is every claim's first step and all a replay does, so it probes the
 * unique index directly instead of running a statement: no plan, no
 * executor.  Like a statement under READ COMMITTED it sees what was
 * committed when it starts, and the transaction's own earlier writes.
 */
bool
idem_record_fetch(const IdemScope *scope, IdemRecord *rec)
{
	return fetch_record(scope, rec, false);
}

/*
 * Read the record of a scope and key as committed now, whatever the
 * transaction's snapshot: under REPEATABLE READ or SERIALIZABLE, whether
 * the record changed since the snapshot was taken.
 */
bool
idem_record_fetch_latest(const IdemScope *scope, IdemRecord *rec)
{
	return fetch_record(scope, rec, true);
}

static bool
fetch_record(const IdemScope *scope, IdemRecord *rec, bool latest)
{
	const IdemCatalog *cat = idem_catalog();
	Snapshot	snapshot;
	Relation	heap;
	TupleTableSlot *slot;
	bool		found;
	int			i;

	/* make this statement's own earlier writes visible, as SPI would */
	CommandCounterIncrement();
	snapshot = RegisterSnapshot(latest ? GetLatestSnapshot() :
								GetTransactionSnapshot());
	heap = table_open(cat->table_oid, AccessShareLock);
	slot = table_slot_create(heap, NULL);

	found = scope_scan(heap, scope, snapshot, slot);
	if (found)
	{
		Datum		values[RECORD_COLUMN_COUNT];
		bool		nulls[RECORD_COLUMN_COUNT];
		const AttrNumber *col = column_attnums(heap);

		for (i = 0; i < RECORD_COLUMN_COUNT; i++)
			values[i] = slot_getattr(slot, col[record_columns[i]], &nulls[i]);
		read_record(values, nulls, rec, CurrentMemoryContext);
		rec->response_raw_body = (bytea *) optional_column(slot, col[COL_RESPONSE_RAW_BODY]);
		rec->response_sealed = (bytea *) optional_column(slot, col[COL_RESPONSE_SEALED]);
		rec->writer_xid = version_writer(slot);
	}

	ExecDropSingleTupleTableSlot(slot);
	table_close(heap, NoLock);
	UnregisterSnapshot(snapshot);
	return found;
}

/*
 * The first row version of the scope and key that the unique index finds
 * under snapshot, into slot (a slot of heap).
 */
static bool
scope_scan(Relation heap, const IdemScope *scope, Snapshot snapshot,
		   TupleTableSlot *slot)
{
	const IdemCatalog *cat = idem_catalog();
	ScanKeyData keys[IDEM_SCOPE_PARTS];
	Relation	index;
	bool		found;

	scope_keys(scope, keys);
	index = index_open(cat->scope_index_oid, AccessShareLock);
	found = scan_key(heap, index, keys, snapshot, slot);
	index_close(index, NoLock);
	return found;
}

/*
 * The first row version of keys that the unique index index finds under
 * snapshot (an MVCC snapshot), into slot.
 */
static bool
scan_key(Relation heap, Relation index, ScanKey keys, Snapshot snapshot,
		 TupleTableSlot *slot)
{
	IndexScanDesc scan;
	bool		found;

	scan = index_beginscan_compat(heap, index, snapshot, IDEM_SCOPE_PARTS, 0);
	index_rescan(scan, keys, IDEM_SCOPE_PARTS, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	index_endscan(scan);
	return found;
}

/*
 * The transaction that updated, deleted or locked the row version in slot,
 * committed or not, other than this one: a claim whose write finds the
 * record taken can wait for it.  InvalidTransactionId when there is none,
 * or when several hold it (a multixact): the claim then polls.
 */
static TransactionId
version_writer(TupleTableSlot *slot)
{
	BufferHeapTupleTableSlot *bslot = (BufferHeapTupleTableSlot *) slot;
	HeapTupleHeader header;
	TransactionId xmax;

	if (!TTS_IS_BUFFERTUPLE(slot) || bslot->base.tuple == NULL)
		return InvalidTransactionId;
	header = bslot->base.tuple->t_data;
	if ((header->t_infomask & HEAP_XMAX_INVALID) ||
		(header->t_infomask & HEAP_XMAX_IS_MULTI))
		return InvalidTransactionId;
	xmax = HeapTupleHeaderGetRawXmax(header);
	if (!TransactionIdIsNormal(xmax) || TransactionIdIsCurrentTransactionId(xmax))
		return InvalidTransactionId;
	return xmax;
}

/*
 * Decrypt the response of a record read with idem_record_fetch, if it was
 * stored encrypted: a replay needs it, other answers do not.
 */
void
idem_record_open_response(IdemRecord *rec)
{
	if (rec->response_sealed == NULL)
		return;
	idem_open_response(rec->id, rec->response_sealed, &rec->response_headers,
					   &rec->response_body, &rec->response_raw_body);
	rec->response_sealed = NULL;
}

/*
 * Read a record of the given role by id, with its scope; any_role reads
 * the record whatever its role (operators only).  Returns false when there
 * is none.
 */
bool
idem_record_fetch_by_id(int64 id, Oid role, bool any_role, IdemRecord *rec)
{
	MemoryContext caller = CurrentMemoryContext;
	Datum		values[3];
	bool		found;

	values[0] = Int64GetDatum(id);
	values[1] = idem_role_column(role);
	values[2] = BoolGetDatum(any_role);
	found = run_plan(PLAN_FETCH_BY_ID, values, NULL) > 0;
	if (found)
		read_spi_row(rec, true, caller);
	SPI_finish();
	return found;
}

/*
 * Insert attempt 1 of a new command (processing, with a token and a lease),
 * or an inbox message (start->finished: succeeded at once, without token,
 * lease or response).  The caller holds the key lock (key_lock.c).
 *
 * Returns false, writing nothing, when the unique index already holds a
 * record of the same scope and key that the read did not see: one that
 * another transaction is inserting or deleting and has not ended yet
 * (*writer is then that transaction), or one committed since the read
 * (*writer is InvalidTransactionId; under REPEATABLE READ or SERIALIZABLE
 * that is a serialization failure, as for INSERT ... ON CONFLICT).
 */
bool
idem_record_insert(const IdemScope *scope, const IdemAttemptStart *start,
				   int64 *id, TransactionId *writer)
{
	IdemRecordWriter w;

	idem_writer_begin(&w);
	/* like INSERT ... ON CONFLICT DO NOTHING: a statement even if it skips */
	idem_writer_start(&w, CMD_INSERT, NULL, 0);
	if (key_held(w.rel, idem_writer_index(&w, idem_catalog()->scope_index_oid),
				 scope, w.old_slot, writer))
	{
		idem_writer_end(&w);
		return false;
	}
	*id = idem_writer_next_id(w.rel);
	insert_row(&w, scope, start, *id, NULL, 0);
	idem_writer_end(&w);
	outcome_written();
	return true;
}

/*
 * Claim a new key without writing its record yet (pending_claim.c keeps
 * it): what idem_record_insert checks and allocates, without the insert.
 * The caller holds the key lock.  Returns false as idem_record_insert does.
 */
bool
idem_record_claim_unwritten(const IdemScope *scope, int64 *id,
							TransactionId *writer)
{
	const IdemCatalog *cat = idem_catalog();
	Relation	heap;
	Relation	index;
	TupleTableSlot *slot;
	bool		held;

	/* the lock its insert will take: no DDL from others until it is written */
	heap = table_open(cat->table_oid, RowExclusiveLock);
	index = index_open(cat->scope_index_oid, RowExclusiveLock);
	slot = table_slot_create(heap, NULL);
	held = key_held(heap, index, scope, slot, writer);
	if (!held)
		*id = idem_writer_next_id(heap);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, NoLock);
	table_close(heap, NoLock);
	if (held)
		return false;
	*writer = InvalidTransactionId;
	/* the claim proceeds: its record will commit with the transaction */
	outcome_written();
	return true;
}

/*
 * Write the record of a claim that idem_record_claim_unwritten allowed,
 * with the id it allocated: processing, as idem_record_insert would have
 * written it, or (response not NULL) finished at once with the response,
 * as the claim followed by its completion at now would have left it.  The
 * caller holds the key lock.
 */
void
idem_record_write_claimed(const IdemScope *scope, const IdemAttemptStart *start,
						  int64 id, const IdemResponse *response,
						  TimestampTz now)
{
	IdemRecordWriter w;

	idem_writer_begin(&w);
	idem_writer_start(&w, CMD_INSERT, NULL, 0);
	insert_row(&w, scope, start, id, response, now);
	idem_writer_end(&w);
	outcome_written();
}

/*
 * Whether a record of the scope and key exists that a new key's claim must
 * not overlook: one that a transaction that has not ended is writing
 * (*writer is then that transaction), or one committed (*writer is
 * InvalidTransactionId; under REPEATABLE READ or SERIALIZABLE that is a
 * serialization failure).  The caller holds the key lock.  slot is a slot
 * of heap, left empty.
 *
 * This is the one place that decides a key is free (see the file header):
 * the dirty probe finds every writer that has not ended, and the read
 * under a snapshot taken after it every record committed before it ended,
 * including one whose only index entry the probe saw was a version that a
 * committed update replaced while the probe was reading.  That read is
 * needed only when the probe found entries of the key whose rows it did
 * not see: a scan finds every entry that was in the index when it began,
 * so with none, no version of the key existed then, and none was begun
 * since, under the key lock.  A new key costs the probe alone.
 */
static bool
key_held(Relation heap, Relation index, const IdemScope *scope,
		 TupleTableSlot *slot, TransactionId *writer)
{
	ScanKeyData keys[IDEM_SCOPE_PARTS];
	Snapshot	latest;
	bool		committed;
	bool		saw_entries;

	scope_keys(scope, keys);
	if (!key_being_written(heap, index, keys, slot, writer, &saw_entries))
	{
		if (!saw_entries)
			return false;
		latest = RegisterSnapshot(GetLatestSnapshot());
		committed = scan_key(heap, index, keys, latest, slot);
		ExecClearTuple(slot);
		UnregisterSnapshot(latest);
		if (!committed)
			return false;
	}
	refuse_claimed_since_snapshot(*writer);
	return true;
}

/*
 * Whether the unique index holds an entry of keys whose row is live or
 * being written, committed or not, visible to this transaction's snapshot
 * or not, judged by a dirty snapshot as check_exclusion_or_unique_constraint
 * judges it.  When that row is being inserted or deleted by a transaction
 * that has not ended, *writer is that transaction, else
 * InvalidTransactionId.  *saw_entries says whether the index held any entry
 * of keys, whatever its row.
 */
static bool
key_being_written(Relation heap, Relation index, ScanKey keys,
				  TupleTableSlot *slot, TransactionId *writer,
				  bool *saw_entries)
{
	SnapshotData dirty;
	IndexScanDesc scan;
	bool		found = false;

	InitDirtySnapshot(dirty);
	scan = index_beginscan_compat(heap, index, &dirty, IDEM_SCOPE_PARTS, 0);
	index_rescan(scan, keys, IDEM_SCOPE_PARTS, NULL, 0);
	*saw_entries = false;
	while (index_getnext_tid(scan, ForwardScanDirection) != NULL)
	{
		*saw_entries = true;
		/* the leaf page has been read; its rows are checked one by one */
		IDEM_TEST_PAUSE("key_probe");
		if (index_fetch_heap(scan, slot))
		{
			found = true;
			break;
		}
	}
	index_endscan(scan);
	ExecClearTuple(slot);
	*writer = InvalidTransactionId;
	if (found)
		*writer = TransactionIdIsValid(dirty.xmin) ? dirty.xmin : dirty.xmax;
	return found;
}

/*
 * A key found taken by a committed record (writer invalid) that the read
 * did not see: under REPEATABLE READ or SERIALIZABLE that is a
 * serialization failure, as for INSERT ... ON CONFLICT.
 */
static void
refuse_claimed_since_snapshot(TransactionId writer)
{
	if (IsolationUsesXactSnapshot() && !TransactionIdIsValid(writer))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent update"),
				 errdetail("Another transaction claimed the same idempotency key after this transaction's snapshot was taken.")));
}

/*
 * Insert a new record: attempt 1 of start, processing (or succeeded for an
 * inbox message), or with a response (a claim and its completion at now,
 * written at once: the row the completion's update would have left).
 */
static void
insert_row(IdemRecordWriter *w, const IdemScope *scope,
		   const IdemAttemptStart *start, int64 id,
		   const IdemResponse *response, TimestampTz now)
{
	const IdemCatalog *cat = idem_catalog();
	const AttrNumber *col = column_attnums(w->rel);
	Datum	   *values;
	bool	   *nulls;
	IdemState	state = response ? response->state :
		start->finished ? IDEM_SUCCEEDED : IDEM_PROCESSING;

	values = idem_writer_new_row(w, &nulls, false);
	set_column(values, nulls, col[COL_ID], Int64GetDatum(id));
	set_column(values, nulls, col[COL_ROLE], idem_role_column(scope->role));
	set_column(values, nulls, col[COL_TENANT], PointerGetDatum(scope->tenant));
	set_column(values, nulls, col[COL_CALLER], PointerGetDatum(scope->caller));
	set_column(values, nulls, col[COL_OPERATION], PointerGetDatum(scope->operation));
	set_column(values, nulls, col[COL_KEY], PointerGetDatum(scope->key));
	set_column(values, nulls, col[COL_FINGERPRINT],
			   bytes_datum(start->fingerprint, IDEM_FINGERPRINT_LEN));
	set_column(values, nulls, col[COL_STATE],
			   ObjectIdGetDatum(cat->state_oids[state]));
	set_column(values, nulls, col[COL_ATTEMPT], Int32GetDatum(1));
	set_column(values, nulls, col[COL_ON_LEASE_EXPIRY],
			   ObjectIdGetDatum(cat->policy_oids[start->on_lease_expiry]));
	set_column(values, nulls, col[COL_TTL], IntervalPGetDatum(start->ttl));
	set_column(values, nulls, col[COL_CREATED_AT], TimestampTzGetDatum(start->now));
	set_column(values, nulls, col[COL_CLAIMED_AT], TimestampTzGetDatum(start->now));
	if (response)
	{
		/* as idem_record_finish sets them */
		set_column(values, nulls, col[COL_RESPONSE_STATUS],
				   Int32GetDatum(response->http_status));
		set_response(values, nulls, col, id, response);
		set_nullable(values, nulls, col[COL_RESOURCE_ID], response->resource_id);
		set_column(values, nulls, col[COL_COMPLETED_AT], TimestampTzGetDatum(now));
		set_column(values, nulls, col[COL_UPDATED_AT], TimestampTzGetDatum(now));
		set_column(values, nulls, col[COL_EXPIRES_AT],
				   DirectFunctionCall2(timestamptz_pl_interval,
									   TimestampTzGetDatum(now),
									   IntervalPGetDatum(start->ttl)));
		idem_guard_allow_finished_insert(true);
		PG_TRY();
		{
			write_new_row(w, scope, id);
		}
		PG_FINALLY();
		{
			idem_guard_allow_finished_insert(false);
		}
		PG_END_TRY();
		return;
	}
	if (start->finished)
		set_column(values, nulls, col[COL_COMPLETED_AT],
				   TimestampTzGetDatum(start->now));
	else
	{
		set_column(values, nulls, col[COL_ATTEMPT_TOKEN],
				   bytes_datum(start->secret, IDEM_TOKEN_SECRET_LEN));
		set_column(values, nulls, col[COL_LOCKED_UNTIL],
				   TimestampTzGetDatum(start->locked_until));
	}
	set_column(values, nulls, col[COL_UPDATED_AT], TimestampTzGetDatum(start->now));
	set_column(values, nulls, col[COL_EXPIRES_AT],
			   TimestampTzGetDatum(start->expires_at));
	write_new_row(w, scope, id);
}

/*
 * Insert the row insert_row filled in, refusing it when a BEFORE INSERT
 * trigger of the owner's changed its id or scope, or skipped it: the claim
 * decided that its own key was free under that key's lock, and a row
 * written under another key, or none, would let the key proceed again (or
 * meet another key's record, 23505).  The check runs when the insert
 * failed too, so that such a trigger is named instead of the unique
 * violation it caused.
 */
static void
write_new_row(IdemRecordWriter *w, const IdemScope *scope, int64 id)
{
	MemoryContext caller = CurrentMemoryContext;

	PG_TRY();
	{
		idem_writer_insert(w);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(caller);
		edata = CopyErrorData();
		FlushErrorState();
		if (edata->sqlerrcode == ERRCODE_UNIQUE_VIOLATION &&
			!row_is_claimed(w->new_slot, w->rel, scope, id))
			refuse_changed_row();
		ReThrowError(edata);
	}
	PG_END_TRY();
	if (!ItemPointerIsValid(&w->new_slot->tts_tid) ||
		!row_is_claimed(w->new_slot, w->rel, scope, id))
		refuse_changed_row();
}

/*
 * Whether the row in slot (of heap) has the id and scope the claim wrote.
 */
static bool
row_is_claimed(TupleTableSlot *slot, Relation heap, const IdemScope *scope,
			   int64 id)
{
	const AttrNumber *col = column_attnums(heap);
	const RecordColumn parts[] = {COL_TENANT, COL_CALLER, COL_OPERATION,
	COL_KEY};
	text	   *wanted[] = {scope->tenant, scope->caller, scope->operation,
	scope->key};
	bool		isnull;
	Datum		value;
	int			i;

	value = slot_getattr(slot, col[COL_ID], &isnull);
	if (isnull || DatumGetInt64(value) != id)
		return false;
	value = slot_getattr(slot, col[COL_ROLE], &isnull);
	if (isnull || !idem_role_column_is(value, scope->role))
		return false;
	for (i = 0; i < (int) lengthof(parts); i++)
	{
		text	   *got;

		value = slot_getattr(slot, col[parts[i]], &isnull);
		if (isnull)
			return false;
		got = DatumGetTextPP(value);
		if (VARSIZE_ANY_EXHDR(got) != VARSIZE_ANY_EXHDR(wanted[i]) ||
			memcmp(VARDATA_ANY(got), VARDATA_ANY(wanted[i]),
				   VARSIZE_ANY_EXHDR(got)) != 0)
			return false;
	}
	return true;
}

/*
 * A trigger changed or skipped a new record: refuse the claim.
 */
static void
refuse_changed_row(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("a trigger on idem_records changed or skipped a new idempotency record"),
			 errdetail("A BEFORE INSERT trigger changed the record's id, scope or key, or returned NULL; the claim's key would not be the key written."),
			 errhint("Drop the trigger, or leave the id, the scope and the key of a new row as they are.")));
}

/*
 * Start a new attempt on an existing record: reuse of an expired record
 * (attempt 1, new fingerprint, recovery point cleared), a takeover of an
 * ended lease or a new attempt after a retryable failure (attempt n+1,
 * recovery point kept).  An inbox message (start->finished) reuses an
 * expired record as a succeeded one at once, without token or lease.  rec
 * is the version the decision was made on; on success rec->recovery_point
 * is set to what the new attempt resumes from.
 * Returns false, writing nothing, when the record changed since it was read
 * or another transaction is writing it.
 */
bool
idem_record_restart(IdemRecord *rec, bool reuse,
					const IdemAttemptStart *start)
{
	const IdemCatalog *cat = idem_catalog();
	MemoryContext caller = CurrentMemoryContext;
	Datum		values[15];
	char		nulls[15];
	bool		isnull;
	Datum		point;

	Assert(!start->finished || reuse);
	memset(nulls, ' ', sizeof(nulls));
	values[0] = Int64GetDatum(rec->id);
	values[1] = Int32GetDatum(rec->attempt);
	values[2] = bytes_datum(start->fingerprint, IDEM_FINGERPRINT_LEN);
	values[3] = ObjectIdGetDatum(cat->state_oids[start->finished ?
												 IDEM_SUCCEEDED : IDEM_PROCESSING]);
	values[4] = Int32GetDatum(reuse ? 1 : rec->attempt + 1);
	values[5] = bytes_datum(start->secret, IDEM_TOKEN_SECRET_LEN);
	values[6] = BoolGetDatum(reuse);
	values[7] = TimestampTzGetDatum(start->locked_until);
	values[14] = TimestampTzGetDatum(start->now);
	if (start->finished)
	{
		/* an inbox record: no token, no lease; completed now */
		nulls[5] = nulls[7] = 'n';
	}
	else
		nulls[14] = 'n';
	values[8] = ObjectIdGetDatum(cat->policy_oids[start->on_lease_expiry]);
	values[9] = IntervalPGetDatum(start->ttl);
	values[10] = TimestampTzGetDatum(start->now);
	values[11] = TimestampTzGetDatum(start->expires_at);
	values[12] = ObjectIdGetDatum(cat->state_oids[rec->state]);
	values[13] = BoolGetDatum(rec->state == IDEM_PROCESSING);
	if (run_plan(reuse && reuse_needs_archive() ? PLAN_RESTART_ARCHIVE :
				 PLAN_RESTART, values, nulls) == 0)
	{
		SPI_finish();
		return false;
	}

	point = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
						  &isnull);
	rec->recovery_point = isnull ? NULL : (text *) copy_out(point, caller);
	SPI_finish();
	outcome_written();
	return true;
}

/*
 * Move a processing record whose lease ended to unknown.  Returns false,
 * writing nothing, when the record changed since it was read or another
 * transaction is writing it.
 */
bool
idem_record_mark_unknown(const IdemRecord *rec, TimestampTz now)
{
	const IdemCatalog *cat = idem_catalog();
	Datum		values[5];

	values[0] = Int64GetDatum(rec->id);
	values[1] = Int32GetDatum(rec->attempt);
	values[2] = ObjectIdGetDatum(cat->state_oids[IDEM_UNKNOWN]);
	values[3] = TimestampTzGetDatum(now);
	values[4] = ObjectIdGetDatum(cat->state_oids[IDEM_PROCESSING]);
	if (run_plan_once(PLAN_MARK_UNKNOWN, values, NULL) == 0)
		return false;
	outcome_written();
	return true;
}

/*
 * Store the outcome of the attempt a token names, returning its record's
 * operation in *operation.  Returns false when the token is not the
 * record's current processing attempt.
 */
bool
idem_record_finish(const IdemToken *token, const IdemResponse *response,
				   TimestampTz now, text **operation)
{
	const IdemCatalog *cat = idem_catalog();
	IdemRecordWriter w;
	const AttrNumber *col;
	Datum	   *values;
	bool	   *nulls;
	bool		ok;
	Datum		ttl;
	AttrNumber	set[12];
	int			nset = 0;

	idem_writer_begin(&w);
	col = column_attnums(w.rel);
	set[nset++] = col[COL_STATE];
	set[nset++] = col[COL_RESPONSE_STATUS];
	set[nset++] = col[COL_RESPONSE_HEADERS];
	set[nset++] = col[COL_RESPONSE_BODY];
	set[nset++] = col[COL_RESOURCE_ID];
	set[nset++] = col[COL_ATTEMPT_TOKEN];
	set[nset++] = col[COL_LOCKED_UNTIL];
	set[nset++] = col[COL_COMPLETED_AT];
	set[nset++] = col[COL_UPDATED_AT];
	set[nset++] = col[COL_EXPIRES_AT];
	if (col[COL_RESPONSE_SEALED] != InvalidAttrNumber)
	{
		set[nset++] = col[COL_RESPONSE_RAW_BODY];
		set[nset++] = col[COL_RESPONSE_SEALED];
	}
	idem_writer_start(&w, CMD_UPDATE, set, nset);
	ok = lock_token_attempt(&w, token);
	if (ok)
	{
		values = idem_writer_new_row(&w, &nulls, true);
		ttl = values[col[COL_TTL] - 1];
		*operation = DatumGetTextPCopy(values[col[COL_OPERATION] - 1]);
		set_column(values, nulls, col[COL_STATE],
				   ObjectIdGetDatum(cat->state_oids[response->state]));
		set_column(values, nulls, col[COL_RESPONSE_STATUS],
				   Int32GetDatum(response->http_status));
		set_response(values, nulls, col, token->record_id, response);
		set_nullable(values, nulls, col[COL_RESOURCE_ID], response->resource_id);
		set_nullable(values, nulls, col[COL_ATTEMPT_TOKEN], NULL);
		set_nullable(values, nulls, col[COL_LOCKED_UNTIL], NULL);
		set_column(values, nulls, col[COL_COMPLETED_AT], TimestampTzGetDatum(now));
		set_column(values, nulls, col[COL_UPDATED_AT], TimestampTzGetDatum(now));
		set_column(values, nulls, col[COL_EXPIRES_AT],
				   DirectFunctionCall2(timestamptz_pl_interval,
									   TimestampTzGetDatum(now), ttl));
		idem_writer_update(&w);
		outcome_written();
	}
	idem_writer_end(&w);
	return ok;
}

/*
 * Move the lease end of the attempt a token names.  Returns false when the
 * token is not the record's current processing attempt.
 */
bool
idem_record_extend_lease(const IdemToken *token, TimestampTz locked_until,
						 TimestampTz now)
{
	return token_write(token, COL_LOCKED_UNTIL,
					   TimestampTzGetDatum(locked_until), now);
}

/*
 * Record how far the attempt a token names got.  Returns false when the
 * token is not the record's current processing attempt.
 */
bool
idem_record_set_recovery_point(const IdemToken *token, text *recovery_point,
							   TimestampTz now)
{
	return token_write(token, COL_RECOVERY_POINT,
					   PointerGetDatum(recovery_point), now);
}

/*
 * Settle an unknown record of the given role (any_role: of any role).
 * Returns false when there is no such unknown record (or it is being
 * written by another transaction, which then wins).
 */
bool
idem_record_resolve(int64 id, Oid role, bool any_role,
					const IdemResponse *response, TimestampTz now)
{
	const IdemCatalog *cat = idem_catalog();
	Datum		values[12];
	char		nulls[12];
	bytea	   *sealed = NULL;
	bool		exact;

	memset(nulls, ' ', sizeof(nulls));
	exact = plans_for_exact_responses();
	require_exact_columns(exact, response);
	if (exact && idem_sealing_enabled() &&
		(response->headers || response->body || response->raw_body))
		sealed = idem_seal_response(id, response->headers, response->body,
									response->raw_body);
	values[0] = Int64GetDatum(id);
	values[1] = ObjectIdGetDatum(cat->state_oids[response->state]);
	values[2] = Int32GetDatum(response->http_status);
	values[3] = nullable(sealed ? NULL : response->headers, &nulls[3]);
	values[4] = nullable(sealed ? NULL : response->body, &nulls[4]);
	values[5] = nullable(response->resource_id, &nulls[5]);
	values[6] = TimestampTzGetDatum(now);
	values[7] = ObjectIdGetDatum(cat->state_oids[IDEM_UNKNOWN]);
	values[8] = idem_role_column(role);
	values[9] = BoolGetDatum(any_role);
	values[10] = nullable(sealed ? NULL : response->raw_body, &nulls[10]);
	values[11] = nullable(sealed, &nulls[11]);
	if (run_plan_once(PLAN_RESOLVE, values, nulls) == 0)
		return false;
	outcome_written();
	return true;
}

/*
 * The kept plan for a statement, prepared on first use and again after the
 * records table was replaced.
 */
static SPIPlanPtr
get_plan(RecordPlan which)
{
	const IdemCatalog *cat = idem_catalog();
	bool		exact = plans_for_exact_responses();

	if (cat->generation != plans_generation || exact != plans_exact)
	{
		int			i;

		for (i = 0; i < NUM_RECORD_PLANS; i++)
		{
			if (plans[i] != NULL)
				SPI_freeplan(plans[i]);
			plans[i] = NULL;
		}
		plans_generation = cat->generation;
		plans_exact = exact;
	}
	if (plans[which] == NULL)
		plans[which] = prepare_plan(which, cat, exact);
	return plans[which];
}

/*
 * Whether the records table has version 1.1's columns for exact responses
 * (ALTER EXTENSION ... UPDATE adds them to a 1.0 table): the statements
 * written for it, and the values read and written, depend on it.  Looked
 * up again whenever the table's relcache entry changes.
 */
static bool
plans_for_exact_responses(void)
{
	const IdemCatalog *cat = idem_catalog();

	if (cat->layout_generation != plans_layout_generation)
	{
		plans_layout_exact = OidIsValid(cat->table_oid) &&
			get_attnum(cat->table_oid, "response_sealed") != InvalidAttrNumber;
		plans_layout_generation = cat->layout_generation;
	}
	return plans_layout_exact;
}

/*
 * Refuse a raw body, or encryption, that a table of version 1.0 cannot
 * store, instead of dropping it.
 */
static void
require_exact_columns(bool exact, const IdemResponse *response)
{
	if (exact)
		return;
	if (response->raw_body != NULL || idem_sealing_enabled())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s needs version 1.1 of extension \"%s\"",
						response->raw_body != NULL ? "a raw body" :
						"idempotency.encryption_key",
						IDEM_EXTENSION_NAME),
				 errhint("Run ALTER EXTENSION %s UPDATE.", IDEM_EXTENSION_NAME)));
}

/*
 * Set the response columns of a row being written: headers, body and raw
 * body as given, or all three encrypted into response_sealed when
 * idempotency.encryption_key is set.
 */
static void
set_response(Datum *values, bool *nulls, const AttrNumber *col, int64 id,
			 const IdemResponse *response)
{
	bool		exact = col[COL_RESPONSE_SEALED] != InvalidAttrNumber;
	bytea	   *sealed = NULL;

	require_exact_columns(exact, response);
	if (exact && idem_sealing_enabled() &&
		(response->headers || response->body || response->raw_body))
		sealed = idem_seal_response(id, response->headers, response->body,
									response->raw_body);
	set_nullable(values, nulls, col[COL_RESPONSE_HEADERS],
				 sealed ? NULL : response->headers);
	set_nullable(values, nulls, col[COL_RESPONSE_BODY],
				 sealed ? NULL : response->body);
	if (exact)
	{
		set_nullable(values, nulls, col[COL_RESPONSE_RAW_BODY],
					 sealed ? NULL : response->raw_body);
		set_nullable(values, nulls, col[COL_RESPONSE_SEALED], sealed);
	}
}

/*
 * A varlena column of the row in slot, copied, or NULL when it is NULL or
 * the table has no such column.
 */
static void *
optional_column(TupleTableSlot *slot, AttrNumber attnum)
{
	bool		isnull;
	Datum		value;

	if (attnum == InvalidAttrNumber)
		return NULL;
	value = slot_getattr(slot, attnum, &isnull);
	return isnull ? NULL : copy_out(value, CurrentMemoryContext);
}

/*
 * The type of the role column's value in a statement: its identity, or
 * the role's name where the SQL installed is older than 1.3.
 */
static Oid
role_column_type(const IdemCatalog *cat)
{
	return cat->role_is_oid ? OIDOID : TEXTOID;
}

/*
 * Prepare one statement against the current records table and keep it.
 */
static SPIPlanPtr
prepare_plan(RecordPlan which, const IdemCatalog *cat, bool exact)
{
	const char *t = cat->qualified_table;
	const char *clear_exact = exact ?
		" response_raw_body = NULL, response_sealed = NULL," : "";
	StringInfoData sql;
	Oid			types[15];
	int			nargs;
	SPIPlanPtr	plan;

	initStringInfo(&sql);
	switch (which)
	{
		case PLAN_FETCH_BY_ID:
			appendStringInfo(&sql,
							 "SELECT " RECORD_COLUMNS ", role, tenant, caller, operation, key"
							 " FROM %s WHERE id" EQ "$1 AND (role" EQ "$2 OR $3)", t);
			types[0] = INT8OID;
			types[1] = role_column_type(cat);
			types[2] = BOOLOID;
			nargs = 3;
			break;
		case PLAN_RESTART:
		case PLAN_RESTART_ARCHIVE:
			{
				/* the version the decision was made on, locked */
				const char *target =
					" WHERE id" EQ "$1"
					" AND state" EQ "$13 AND attempt" EQ "$2"
					" AND (NOT $7 OR expires_at" LE "$11)"
					" AND (NOT $14 OR locked_until" LE "$11)"
					" FOR UPDATE SKIP LOCKED";

				if (which == PLAN_RESTART)
					appendStringInfo(&sql, "UPDATE %s", t);
				else
				{
					/*
					 * The row is locked first and copied as locked (its
					 * newest version, rechecked), then changed: a record
					 * another transaction holds is neither copied nor
					 * reused.
					 */
					char	   *nsp = get_namespace_name(cat->schema_oid);
					const char *columns = cat->role_is_oid ?
						IDEM_ARCHIVE_COLUMNS_1_3 : IDEM_ARCHIVE_COLUMNS;

					Assert(exact);
					if (nsp == NULL)
						elog(ERROR, "schema %u of extension \"%s\" not found",
							 cat->schema_oid, IDEM_EXTENSION_NAME);
					nsp = (char *) quote_identifier(nsp);

					appendStringInfo(&sql,
									 "WITH target AS (SELECT %s FROM %s%s),"
									 " archived AS (INSERT INTO %s.%s"
									 " (%s, archived_at)"
									 " SELECT %s, pg_catalog.clock_timestamp()"
									 " FROM target AS o WHERE NOT EXISTS"
									 " (SELECT FROM %s.%s AS x WHERE x.id" EQ "o.id"
									 " AND x.claimed_at" EQ "o.claimed_at))"
									 " UPDATE %s", columns, t, target,
									 nsp, IDEM_ARCHIVE_TABLE, columns, columns,
									 nsp, IDEM_ARCHIVE_TABLE, t);
				}
				appendStringInfo(&sql,
								 " SET fingerprint = $3, state = $4, attempt = $5,"
								 " attempt_token = $6,"
								 " recovery_point = CASE WHEN $7 THEN NULL ELSE recovery_point END,"
								 " locked_until = $8, on_lease_expiry = $9, ttl = $10,"
								 " response_status = NULL, response_headers = NULL,"
								 " response_body = NULL, resource_id = NULL,%s"
								 " claimed_at = $11, updated_at = $11, completed_at = $15,"
								 " expires_at = $12",
								 clear_exact);
				if (which == PLAN_RESTART)
					appendStringInfo(&sql,
									 " WHERE id" EQ "(SELECT id FROM %s%s)", t, target);
				else
					appendStringInfoString(&sql,
										   " WHERE id" EQ "(SELECT id FROM target)");
				appendStringInfoString(&sql, " RETURNING recovery_point");
			}
			types[0] = INT8OID;
			types[1] = INT4OID;
			types[2] = BYTEAOID;
			types[3] = cat->state_type;
			types[4] = INT4OID;
			types[5] = BYTEAOID;
			types[6] = BOOLOID;
			types[7] = TIMESTAMPTZOID;
			types[8] = cat->policy_type;
			types[9] = INTERVALOID;
			types[10] = types[11] = TIMESTAMPTZOID;
			types[12] = cat->state_type;
			types[13] = BOOLOID;
			types[14] = TIMESTAMPTZOID;
			nargs = 15;
			break;
		case PLAN_MARK_UNKNOWN:
			appendStringInfo(&sql,
							 "UPDATE %s SET state = $3, updated_at = $4,"
							 " expires_at = $4" PLUS "ttl"
							 " WHERE id" EQ "(SELECT id FROM %s WHERE id" EQ "$1"
							 " AND attempt" EQ "$2 AND state" EQ "$5"
							 " AND locked_until" LE "$4 FOR UPDATE SKIP LOCKED)"
							 " RETURNING id", t, t);
			types[0] = INT8OID;
			types[1] = INT4OID;
			types[2] = cat->state_type;
			types[3] = TIMESTAMPTZOID;
			types[4] = cat->state_type;
			nargs = 5;
			break;
		case PLAN_RESOLVE:
			appendStringInfo(&sql,
							 "UPDATE %s SET state = $2, response_status = $3,"
							 " response_headers = $4, response_body = $5,%s"
							 " resource_id = coalesce($6, resource_id),"
							 " completed_at = $7, updated_at = $7,"
							 " expires_at = $7" PLUS "ttl"
							 " WHERE id" EQ "$1 AND state" EQ "$8"
							 " AND (role" EQ "$9 OR $10) RETURNING id", t,
							 exact ? " response_raw_body = $11, response_sealed = $12," : "");
			types[0] = INT8OID;
			types[1] = cat->state_type;
			types[2] = INT4OID;
			types[3] = types[4] = JSONBOID;
			types[5] = TEXTOID;
			types[6] = TIMESTAMPTZOID;
			types[7] = cat->state_type;
			types[8] = role_column_type(cat);
			types[9] = BOOLOID;
			types[10] = types[11] = BYTEAOID;
			nargs = exact ? 12 : 10;
			break;
		default:
			elog(ERROR, "unrecognized record statement %d", (int) which);
	}

	plan = SPI_prepare(sql.data, nargs, types);
	if (plan == NULL)
		elog(ERROR, "could not prepare \"%s\": %s", sql.data,
			 SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "could not keep plan for \"%s\"", sql.data);
	pfree(sql.data);
	return plan;
}

/*
 * Whether a reuse must copy the record to the archive first: with
 * idempotency.cleanup_action = 'archive'.  As the cleanup passes do, a
 * reuse whose copy cannot be made (the archive renamed or moved away, or a
 * table still at version 1.0) is refused rather than made without it.
 */
static bool
reuse_needs_archive(void)
{
	const IdemCatalog *cat = idem_catalog();

	if (idem_cleanup_action != IDEM_CLEANUP_ARCHIVE)
		return false;
	if (!plans_for_exact_responses())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency cannot reuse an expired record: the archive needs version 1.1 of extension \"%s\"",
						IDEM_EXTENSION_NAME),
				 errdetail("idempotency.cleanup_action is \"archive\": no record is reused for a new command without a copy of the previous one."),
				 errhint("Run ALTER EXTENSION %s UPDATE, or set idempotency.cleanup_action to \"delete\" for this database.",
						 IDEM_EXTENSION_NAME)));
	if (!OidIsValid(get_relname_relid(IDEM_ARCHIVE_TABLE, cat->schema_oid)))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("idempotency cannot reuse an expired record: relation \"%s\" does not exist",
						IDEM_ARCHIVE_TABLE),
				 errdetail("idempotency.cleanup_action is \"archive\": no record is reused for a new command without a copy of the previous one."),
				 errhint("Give the table back its name, or set idempotency.cleanup_action to \"delete\".")));
	return true;
}

/*
 * Connect to SPI and execute a kept statement; returns the number of rows
 * it returned, in SPI_tuptable.  The caller reads them and calls
 * SPI_finish.  Not read-only, so that under READ COMMITTED each call sees
 * the latest committed data.
 */
static int
run_plan(RecordPlan which, Datum *values, const char *nulls)
{
	MemoryContext caller = CurrentMemoryContext;
	int			ret;

	/* every kept statement but the fetch writes the record */
	if (which != PLAN_FETCH_BY_ID)
		idem_refuse_write_during_ddl();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	/* a constraint error must not show the row, as for the direct writes */
	PG_TRY();
	{
		ret = SPI_execute_plan(get_plan(which), values, nulls, false, 1);
	}
	PG_CATCH();
	{
		idem_rethrow_without_values(caller);
	}
	PG_END_TRY();
	if (ret < 0)
		elog(ERROR, "idempotency record statement %d failed: %s",
			 (int) which, SPI_result_code_string(ret));
	return (int) SPI_processed;
}

/*
 * Execute a kept statement whose rows are not needed; returns how many
 * there were.
 */
static int
run_plan_once(RecordPlan which, Datum *values, const char *nulls)
{
	int			processed = run_plan(which, values, nulls);

	SPI_finish();
	return processed;
}

/*
 * A write that someone will act on (a claim that proceeds, an outcome, a
 * record marked unknown) was made.  With idempotency.synchronous_outcomes,
 * the transaction commits synchronously whatever synchronous_commit says:
 * an asynchronous commit is visible before it is on disk, and a crash would
 * take back a claim a client already acted on, or an outcome already
 * replayed.  Lease extensions and recovery points are not outcomes.
 */
static void
outcome_written(void)
{
	if (idem_synchronous_outcomes)
		ForceSyncCommit();
}

/*
 * Scan keys of the unique index for a scope and key, in the index's order
 * of columns.
 */
static void
scope_keys(const IdemScope *scope, ScanKey keys)
{
	const IdemCatalog *cat = idem_catalog();
	text	   *parts[IDEM_SCOPE_PARTS];
	int			i;

	parts[IDEM_SCOPE_ROLE] = NULL;
	parts[IDEM_SCOPE_TENANT] = scope->tenant;
	parts[IDEM_SCOPE_CALLER] = scope->caller;
	parts[IDEM_SCOPE_OPERATION] = scope->operation;
	parts[IDEM_SCOPE_KEY] = scope->key;
	for (i = 0; i < IDEM_SCOPE_PARTS; i++)
	{
		IdemScopePart part = cat->scope_index_part[i];

		if (part == IDEM_SCOPE_ROLE)
			ScanKeyInit(&keys[i], i + 1, BTEqualStrategyNumber,
						cat->role_is_oid ? F_OIDEQ : F_TEXTEQ,
						idem_role_column(scope->role));
		else
			ScanKeyInit(&keys[i], i + 1, BTEqualStrategyNumber, F_TEXTEQ,
						PointerGetDatum(parts[part]));
	}
}

/*
 * Lock the record a token names, waiting for other writers, and check that
 * it is still processing the very attempt the token names, for the role
 * that claimed it.  Returns false when it is not.
 *
 * The role and the secret are checked on the committed row before anything
 * locks or waits: a token naming another role's record, or with a wrong
 * secret, is refused at once, exactly as one naming no record, so that it
 * cannot tell by an error or a wait which records exist or are being
 * written.  Only then is the row locked, and checked again in full.
 */
static bool
lock_token_attempt(IdemRecordWriter *w, const IdemToken *token)
{
	const IdemCatalog *cat = idem_catalog();
	const AttrNumber *col;
	TupleTableSlot *slot = w->old_slot;
	bool		isnull;
	Datum		value;

	col = column_attnums(w->rel);
	if (!idem_writer_read(w, token->record_id) ||
		!token_owns_row(slot, col, token))
		return false;
	if (!idem_writer_lock_read(w, LockWaitBlock) ||
		!token_owns_row(slot, col, token))
		return false;

	value = slot_getattr(slot, col[COL_STATE], &isnull);
	if (isnull || DatumGetObjectId(value) != cat->state_oids[IDEM_PROCESSING])
		return false;
	value = slot_getattr(slot, col[COL_ATTEMPT], &isnull);
	return !isnull && DatumGetInt32(value) == token->attempt;
}

/*
 * Whether the row in slot belongs to the token's role and holds its
 * secret.  Both compare as bytes (the role column's collation is "C"), the
 * secret in constant time.
 */
static bool
token_owns_row(TupleTableSlot *slot, const AttrNumber *col,
			   const IdemToken *token)
{
	bool		isnull;
	Datum		value;
	bytea	   *secret;
	const uint8 *stored;
	uint8		diff = 0;
	int			i;

	value = slot_getattr(slot, col[COL_ROLE], &isnull);
	if (isnull || !idem_role_column_is(value, token->role))
		return false;

	value = slot_getattr(slot, col[COL_ATTEMPT_TOKEN], &isnull);
	if (isnull)
		return false;
	secret = DatumGetByteaPP(value);
	if (VARSIZE_ANY_EXHDR(secret) != IDEM_TOKEN_SECRET_LEN)
		return false;
	stored = (const uint8 *) VARDATA_ANY(secret);
	for (i = 0; i < IDEM_TOKEN_SECRET_LEN; i++)
		diff |= stored[i] ^ token->secret[i];
	return diff == 0;
}

/*
 * Set one column of the attempt a token names, and its updated_at.
 * Returns false when the token is not the record's current processing
 * attempt.
 */
static bool
token_write(const IdemToken *token, RecordColumn column, Datum value,
			TimestampTz now)
{
	IdemRecordWriter w;
	const AttrNumber *col;
	Datum	   *values;
	bool	   *nulls;
	bool		ok;
	AttrNumber	set[2];

	idem_writer_begin(&w);
	col = column_attnums(w.rel);
	set[0] = col[column];
	set[1] = col[COL_UPDATED_AT];
	idem_writer_start(&w, CMD_UPDATE, set, lengthof(set));
	ok = lock_token_attempt(&w, token);
	if (ok)
	{
		values = idem_writer_new_row(&w, &nulls, true);
		set_column(values, nulls, col[column], value);
		set_column(values, nulls, col[COL_UPDATED_AT], TimestampTzGetDatum(now));
		idem_writer_update(&w);
	}
	idem_writer_end(&w);
	return ok;
}

/*
 * Column numbers of the RecordColumn columns in the records table, found
 * again whenever the table's definition may have changed.
 */
static const AttrNumber *
column_attnums(Relation heap)
{
	static AttrNumber attnums[NUM_RECORD_COLUMNS];
	static uint64 attnums_layout = 0;
	uint64		layout = idem_catalog()->layout_generation;

	if (attnums_layout != layout)
	{
		static const char *const names[NUM_RECORD_COLUMNS] = {
			"id", "role", "tenant", "caller", "operation", "key",
			"fingerprint", "state", "attempt", "attempt_token",
			"recovery_point", "locked_until", "on_lease_expiry", "ttl",
			"response_status", "response_headers", "response_body",
			"resource_id", "created_at", "claimed_at", "updated_at",
			"completed_at", "expires_at", "response_raw_body",
			"response_sealed"
		};
		AttrNumber	found[NUM_RECORD_COLUMNS];
		int			i;

		/* all found, or the old numbers stay (and are looked for again) */
		for (i = 0; i < NUM_RECORD_COLUMNS; i++)
		{
			/* version 1.1's columns are missing while the table is 1.0's */
			if (i >= FIRST_OPTIONAL_COLUMN)
			{
				int			attnum = SPI_fnumber(RelationGetDescr(heap), names[i]);

				found[i] = attnum > 0 ? (AttrNumber) attnum : InvalidAttrNumber;
			}
			else
				found[i] = idem_column_number(RelationGetDescr(heap), names[i]);
		}
		memcpy(attnums, found, sizeof(attnums));
		attnums_layout = layout;
	}
	return attnums;
}

/*
 * Set a column of a row being written.
 */
static void
set_column(Datum *values, bool *nulls, AttrNumber attnum, Datum value)
{
	values[attnum - 1] = value;
	nulls[attnum - 1] = false;
}

/*
 * Set a column of a row being written to a varlena value or NULL.
 */
static void
set_nullable(Datum *values, bool *nulls, AttrNumber attnum, void *pointer)
{
	values[attnum - 1] = PointerGetDatum(pointer);
	nulls[attnum - 1] = pointer == NULL;
}

/*
 * Copy the values of RECORD_COLUMNS, in that order, into rec, varlena
 * values into the given memory context.
 */
static void
read_record(const Datum *values, const bool *nulls, IdemRecord *rec,
			MemoryContext into)
{
	const IdemCatalog *cat = idem_catalog();
	bytea	   *fingerprint;

	memset(rec, 0, sizeof(*rec));
	rec->id = DatumGetInt64(values[0]);
	rec->state = idem_state_from_oid(cat, DatumGetObjectId(values[1]));
	rec->attempt = DatumGetInt32(values[2]);
	fingerprint = DatumGetByteaPP(values[3]);
	if (VARSIZE_ANY_EXHDR(fingerprint) != IDEM_FINGERPRINT_LEN)
		elog(ERROR, "fingerprint of idempotency record " INT64_FORMAT " has %d bytes",
			 rec->id, (int) VARSIZE_ANY_EXHDR(fingerprint));
	memcpy(rec->fingerprint, VARDATA_ANY(fingerprint), IDEM_FINGERPRINT_LEN);
	rec->recovery_point = nulls[4] ? NULL : (text *) copy_out(values[4], into);
	rec->has_lease = !nulls[5];
	rec->locked_until = nulls[5] ? 0 : DatumGetTimestampTz(values[5]);
	rec->on_lease_expiry = idem_policy_from_oid(cat, DatumGetObjectId(values[6]));
	rec->has_response_status = !nulls[7];
	rec->response_status = nulls[7] ? 0 : DatumGetInt32(values[7]);
	rec->response_headers = nulls[8] ? NULL : (Jsonb *) copy_out(values[8], into);
	rec->response_body = nulls[9] ? NULL : (Jsonb *) copy_out(values[9], into);
	rec->resource_id = nulls[10] ? NULL : (text *) copy_out(values[10], into);
	rec->expires_at = DatumGetTimestampTz(values[11]);
}

/*
 * Copy the first row SPI returned (RECORD_COLUMNS, then the scope columns
 * if with_scope) into rec.
 */
static void
read_spi_row(IdemRecord *rec, bool with_scope, MemoryContext into)
{
	HeapTuple	tuple = SPI_tuptable->vals[0];
	TupleDesc	tupdesc = SPI_tuptable->tupdesc;
	Datum		values[RECORD_COLUMN_COUNT];
	bool		nulls[RECORD_COLUMN_COUNT];
	bool		isnull;
	Datum		value;
	int			i;

	for (i = 0; i < RECORD_COLUMN_COUNT; i++)
		values[i] = SPI_getbinval(tuple, tupdesc, i + 1, &nulls[i]);
	read_record(values, nulls, rec, into);

	if (with_scope)
	{
		i = RECORD_COLUMN_COUNT + 1;
		value = SPI_getbinval(tuple, tupdesc, i++, &isnull);
		rec->scope.role = isnull ? InvalidOid : idem_role_column_role(value);
		rec->scope.tenant = (text *) copy_out(SPI_getbinval(tuple, tupdesc, i++, &isnull), into);
		rec->scope.caller = (text *) copy_out(SPI_getbinval(tuple, tupdesc, i++, &isnull), into);
		rec->scope.operation = (text *) copy_out(SPI_getbinval(tuple, tupdesc, i++, &isnull), into);
		rec->scope.key = (text *) copy_out(SPI_getbinval(tuple, tupdesc, i, &isnull), into);
	}
}

/*
 * Copy a varlena value, detoasted, into the given context.
 */
static void *
copy_out(Datum value, MemoryContext into)
{
	struct varlena *v = PG_DETOAST_DATUM(value);
	void	   *copy = MemoryContextAlloc(into, VARSIZE(v));

	memcpy(copy, v, VARSIZE(v));
	return copy;
}

/*
 * A bytea datum holding len bytes.
 */
static Datum
bytes_datum(const uint8 *bytes, int len)
{
	bytea	   *b = palloc(VARHDRSZ + len);

	SET_VARSIZE(b, VARHDRSZ + len);
	memcpy(VARDATA(b), bytes, len);
	return PointerGetDatum(b);
}

/*
 * A datum for an optional varlena argument, marking NULL in *null.
 */
static Datum
nullable(void *pointer, char *null)
{
	*null = pointer == NULL ? 'n' : ' ';
	return PointerGetDatum(pointer);
}

/*
 * Define the settings of how a record is written and how long it lives:
 * whether an outcome commits synchronously, how long an expired record is
 * kept as a tombstone, and what cleanup does with it.  Called from
 * _PG_init on every load.
 */
void
idem_records_init(void)
{
	DefineCustomBoolVariable("idempotency.synchronous_outcomes",
							 "Commits every transaction that writes an idempotency record synchronously.",
							 "A claim that proceeds, a completion, a failure or a resolve is then on disk "
							 "before anyone is told it, whatever synchronous_commit says.",
							 &idem_synchronous_outcomes,
							 true,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.tombstone_ttl",
							"Time a finished record is kept as a tombstone past its expiry.",
							"Cleanup purges the stored response of a record past its expiry "
							"and deletes the rest this long after the expiry; until then a "
							"claim of its key answers expired.  0 deletes at once.",
							&idem_tombstone_ttl_s,
							7 * 24 * 60 * 60, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomEnumVariable("idempotency.cleanup_action",
							 "What cleanup does with a record before purging or deleting it.",
							 "archive copies the full record to idem_records_archive first; "
							 "delete does not.",
							 &idem_cleanup_action,
							 IDEM_CLEANUP_DELETE, cleanup_action_options,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);
}
