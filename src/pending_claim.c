/*-------------------------------------------------------------------------
 *
 * pending_claim.c
 *	  A new key claimed in a transaction block, whose record is written
 *	  once: finished, when the attempt completes or fails in the same
 *	  transaction, or processing, before the transaction commits or
 *	  prepares.
 *
 * A new key claimed and completed in one transaction used to be inserted
 * as processing and then updated with its outcome: two row versions and
 * seven index entries, for a record of which only the final version ever
 * commits.  Instead, idem_claim of a new key inside a transaction block
 * keeps here what it would have inserted (the id and token are allocated
 * as before), holds on to the key lock (key_lock.c) and answers proceed.
 * idem_complete or idem_fail with its token then inserts the finished
 * record once, as the claim followed by the completion would have left it,
 * and gives the key lock back.  If the transaction commits or prepares
 * without that, the processing record is inserted first: a committed claim
 * always has its record, exactly as before.
 *
 * Other transactions cannot tell the difference.  A claim of the same key
 * finds the key lock taken, as while a row is being inserted, and answers
 * in_progress at once or waits for the lock; when it is given back, the
 * row is in the unique index, where the waiting claim finds it and waits
 * for the transaction as before.  Within the transaction, every function
 * of the extension writes the pending record before it reads or writes
 * any record (idem_pending_write), so it sees the claim as it always did.
 * A DDL statement in the transaction writes it first too, so that a
 * constraint, index or trigger added then sees the row as before.  Only a
 * plain SELECT of idem_records in the claiming transaction, which only the
 * table's owner can run, does not see the record until the completion or
 * the commit.
 *
 * A claim stays pending only inside a transaction block (outside one it
 * commits at once anyway), only one at a time per transaction (the next
 * claim writes at once), only outside a DDL statement, only while
 * idem_records has no trigger but the extension's guard: a trigger or a
 * foreign key of the owner's may look for the row, and at commit deferred
 * triggers have already fired; and only while nothing in the table could
 * refuse the row at commit that would have refused it at the claim
 * (catalog.c, records_as_created, and scope_entry_fits below).
 *
 * Savepoints.  The pending claim belongs to the subtransaction that made
 * it, and to its parent once that is released, as does the key lock; when
 * that subtransaction is rolled back the claim is forgotten and PostgreSQL
 * releases the lock.  A record written for the claim in a deeper
 * subtransaction that is then rolled back is gone, so the claim is pending
 * again.  Only a record written in the claim's own subtransaction gives the
 * key lock back at once; otherwise the lock is held until the transaction
 * ends and no other claim is kept pending in that transaction, so that
 * this never holds more than one key lock.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/itup.h"
#include "access/nbtree.h"
#include "access/table.h"
#include "access/xact.h"
#include "commands/trigger.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "tcop/utility.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/relcache.h"
#include "utils/resowner.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "catalog.h"
#include "key_lock.h"
#include "pending_claim.h"
#include "record_writer.h"
#include "security.h"

typedef struct PendingClaim
{
	bool		active;
	bool		written;		/* its record is in the table, written in
								 * written_subid, deeper than claim_subid */
	SubTransactionId claim_subid;
	SubTransactionId written_subid;
	LOCKTAG		lock;
	int64		id;
	IdemScope	scope;			/* in pending_context */
	IdemAttemptStart start;		/* ttl in pending_context */
} PendingClaim;

static PendingClaim pending;
static MemoryContext pending_context = NULL;

/* the key lock of an earlier pending claim is held until the end */
static bool lock_kept = false;
static bool callbacks_registered = false;
static ProcessUtility_hook_type prev_process_utility = NULL;

/*
 * Whether the library was loaded by a call of the current transaction: the
 * hook did not see a DDL statement that was already running.  Cleared when
 * that transaction commits, prepares or aborts.
 */
static bool loaded_in_transaction = false;

static void register_callbacks(void);
static bool pending_possible(const IdemScope *scope);
static bool scope_entry_fits(const IdemScope *scope);
static void keep(const IdemScope *scope, const IdemAttemptStart *start,
				 int64 id, const LOCKTAG *lock);
static bool records_only_guarded(void);
static void write_pending(const IdemResponse *response, TimestampTz now);
static void write_before_commit(void);
static void write_pending_processing(void);
static void pending_process_utility(PlannedStmt *pstmt, const char *queryString,
									bool readOnlyTree,
									ProcessUtilityContext context,
									ParamListInfo params,
									QueryEnvironment *queryEnv,
									DestReceiver *dest, QueryCompletion *qc);
static void run_utility(PlannedStmt *pstmt, const char *queryString,
						bool readOnlyTree, ProcessUtilityContext context,
						ParamListInfo params, QueryEnvironment *queryEnv,
						DestReceiver *dest, QueryCompletion *qc);
static void rehome_key_lock(const LOCKTAG *lock);
static void forget(void);
static text *copy_text(const text *t);
static bool same_secret(const uint8 *a, const uint8 *b);
static void pending_xact_callback(XactEvent event, void *arg);
static void pending_subxact_callback(SubXactEvent event,
									 SubTransactionId mySubid,
									 SubTransactionId parentSubid, void *arg);

/*
 * The largest entry a btree index takes on a page of BLCKSZ bytes, as
 * nbtree computes it (BTMaxItemSize).
 */
#define SCOPE_ENTRY_MAX \
	(MAXALIGN_DOWN((BLCKSZ - \
					MAXALIGN(SizeOfPageHeaderData + 3 * sizeof(ItemIdData)) - \
					MAXALIGN(sizeof(BTPageOpaqueData))) / 3) - \
	 MAXALIGN(sizeof(ItemPointerData)))

/*
 * Claim a new key, whose key lock the caller holds: kept pending, holding
 * the lock until its record is written, when the claim may stay pending
 * (idem_claim in a transaction block) and this one can; otherwise its
 * record is inserted now and the lock given back once the row is in the
 * unique index.  Returns whether the key was claimed, with the record's id;
 * when it was not, the lock is given back, and writer is the transaction
 * found writing the key, if any.
 */
bool
idem_pending_claim_new(const IdemScope *scope, const IdemAttemptStart *start,
					   bool may_stay_pending, const LOCKTAG *lock,
					   int64 *id, TransactionId *writer)
{
	bool		wrote;

	if (may_stay_pending && pending_possible(scope))
	{
		/* written at its completion, or at commit, holding the lock */
		wrote = idem_record_claim_unwritten(scope, id, writer);
		if (wrote)
			keep(scope, start, *id, lock);
		else
			idem_key_lock_release(lock);
	}
	else
	{
		wrote = idem_record_insert(scope, start, id, writer);
		idem_key_lock_release(lock);
	}
	return wrote;
}

/*
 * Whether a claim of a new key of this scope may be kept pending instead
 * of written now.
 */
static bool
pending_possible(const IdemScope *scope)
{
	return !pending.active && !lock_kept && idem_ddl_depth == 0 &&
		!loaded_in_transaction && IsTransactionBlock() &&
		idem_catalog()->records_as_created && scope_entry_fits(scope);
}

/*
 * Whether the scope's entry in the unique index fits for sure, counted
 * uncompressed with four-byte headers.  A longer one (with
 * idempotency.max_key_length raised) may not fit: its record is written
 * at the claim, so that the claim fails, not the commit after the claim
 * answered proceed.
 */
static bool
scope_entry_fits(const IdemScope *scope)
{
	const text *const parts[] = {
		scope->key, scope->operation, scope->caller, scope->tenant
	};
	Size		size = MAXALIGN(sizeof(IndexTupleData));
	int			i;

	for (i = 0; i < (int) lengthof(parts); i++)
		size = INTALIGN(size) + VARHDRSZ + VARSIZE_ANY_EXHDR(parts[i]);
	/* the role: an oid, or a name (before 1.3), counted at its longest */
	size = INTALIGN(size) + VARHDRSZ + NAMEDATALEN;
	return MAXALIGN(size) <= SCOPE_ENTRY_MAX;
}

/*
 * Keep the claim of a new key: its scope, attempt and allocated id.  The
 * caller holds the key lock, which stays held until the record is written.
 */
static void
keep(const IdemScope *scope, const IdemAttemptStart *start, int64 id,
	 const LOCKTAG *lock)
{
	MemoryContext oldcontext;

	Assert(!pending.active);
	register_callbacks();
	oldcontext = MemoryContextSwitchTo(pending_context);
	pending.scope.role = scope->role;
	pending.scope.tenant = copy_text(scope->tenant);
	pending.scope.caller = copy_text(scope->caller);
	pending.scope.operation = copy_text(scope->operation);
	pending.scope.key = copy_text(scope->key);
	pending.start = *start;
	pending.start.ttl = palloc(sizeof(Interval));
	memcpy(pending.start.ttl, start->ttl, sizeof(Interval));
	MemoryContextSwitchTo(oldcontext);

	pending.id = id;
	pending.lock = *lock;
	rehome_key_lock(&pending.lock);
	pending.claim_subid = GetCurrentSubTransactionId();
	pending.written = false;
	pending.active = true;
}

/*
 * Write the pending claim's record, processing, if it is not written: what
 * every function of the extension does before it reads or writes a record.
 * Returns whether it wrote it: a read in the same statement then needs a
 * snapshot taken after the write (CommandCounterIncrement) to see it.
 */
bool
idem_pending_write(void)
{
	if (!pending.active || pending.written)
		return false;
	write_pending(NULL, 0);
	return true;
}

/*
 * Store the outcome of the attempt the token names if that is the pending
 * claim: its record is written once, finished.  Otherwise write the
 * pending claim (if any) and return false: the caller stores the outcome
 * in the record as usual.  *operation is set to the claim's operation.
 */
bool
idem_pending_finish(const IdemToken *token, const IdemResponse *response,
					text **operation)
{
	if (!pending.active || pending.written)
		return false;
	if (token->record_id != pending.id || token->attempt != 1 ||
		!same_secret(token->secret, pending.start.secret) ||
		token->role != pending.scope.role ||
		!idem_catalog()->records_as_created)
	{
		write_pending(NULL, 0);
		return false;
	}
	*operation = copy_text(pending.scope.operation);
	write_pending(response, GetCurrentTimestamp());
	return true;
}

/*
 * Register the transaction callbacks, once: at the first claim kept
 * pending, or when the library is loaded inside a transaction.
 */
static void
register_callbacks(void)
{
	if (callbacks_registered)
		return;
	pending_context = AllocSetContextCreate(TopMemoryContext,
											"idempotency pending claim",
											ALLOCSET_SMALL_SIZES);
	RegisterXactCallback(pending_xact_callback, NULL);
	RegisterSubXactCallback(pending_subxact_callback, NULL);
	callbacks_registered = true;
}

/*
 * Whether idem_records has no trigger but the extension's guard.
 */
static bool
records_only_guarded(void)
{
	const IdemCatalog *cat = idem_catalog();
	Relation	rel = table_open(cat->table_oid, AccessShareLock);
	TriggerDesc *triggers = rel->trigdesc;
	bool		only_guard;

	only_guard = triggers != NULL && triggers->numtriggers == 1 &&
		triggers->triggers[0].tgfoid == cat->guard_function;
	table_close(rel, NoLock);
	return only_guard;
}

/*
 * Insert the pending claim's record: processing, or (response not NULL)
 * finished at now.  Written in the claim's own subtransaction, the record
 * takes over from the key lock, which is given back; written deeper, the
 * claim is remembered until that subtransaction ends.
 */
static void
write_pending(const IdemResponse *response, TimestampTz now)
{
	IdemUserContext user;

	idem_become_owner(&user);
	idem_record_write_claimed(&pending.scope, &pending.start, pending.id,
							  response, now);
	idem_restore_user(&user);

	pending.written_subid = GetCurrentSubTransactionId();
	pending.written = true;
	if (pending.written_subid == pending.claim_subid)
	{
		ResourceOwner saved = CurrentResourceOwner;

		/* held by this subtransaction, not by the statement (see keep) */
		CurrentResourceOwner = CurTransactionResourceOwner;
		idem_key_lock_release(&pending.lock);
		CurrentResourceOwner = saved;
		forget();
	}
}

/*
 * Before the transaction commits or prepares: write the claim, processing,
 * if it is still pending.  Deferred triggers have fired by now, so this
 * must not queue any: if idem_records gained a trigger since the claim,
 * the commit fails instead (nothing is committed; the client retries).
 */
static void
write_before_commit(void)
{
	/* DDL writes the record first (pending_process_utility): a safeguard */
	if (!records_only_guarded())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("cannot commit a claim whose record is not written yet after a trigger was added to idem_records"),
				 errdetail("The claim of record " INT64_FORMAT " was made before the trigger existed.",
						   pending.id),
				 errhint("Complete the claim, or read idem_records through the extension's functions, before changing the table in the same transaction.")));
	write_pending_processing();
}

/*
 * Write the pending claim's record, processing, outside any function of the
 * extension (before the commit, before a DDL statement), under a snapshot
 * of its own if there is none.
 */
static void
write_pending_processing(void)
{
	bool		snapshot_pushed = false;

	if (!ActiveSnapshotSet())
	{
		PushActiveSnapshot(GetTransactionSnapshot());
		snapshot_pushed = true;
	}
	write_pending(NULL, 0);
	if (snapshot_pushed)
		PopActiveSnapshot();
}

/*
 * Install the hook that writes a pending claim's record before any DDL
 * statement of its transaction.  Loaded by a call (not preloaded), the
 * library may be loaded in the middle of a DDL statement, from an event
 * trigger, say: no claim of that transaction is kept pending.
 */
void
idem_pending_install_hooks(void)
{
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = pending_process_utility;
	if (IsTransactionState())
	{
		register_callbacks();
		loaded_in_transaction = true;
	}
}

/*
 * ProcessUtility_hook: a DDL statement in the transaction of a pending
 * claim (a constraint, column, index or trigger added to idem_records, say)
 * runs after the claim's record is written, as it did when every claim
 * wrote at once: it checks or sees that row now, instead of the row failing
 * at the commit after the claim answered proceed.  The statement runs
 * under a snapshot that sees the row too, so that its own reads (CREATE
 * TABLE AS, a default or USING expression) find it as before.
 *
 * A claim made while a DDL statement runs (from an event trigger, or a
 * function the statement calls) is written at once for the same reason:
 * the rest of that statement may change the table.  The count of running
 * DDL statements is restored however the statement ends.
 */
static void
pending_process_utility(PlannedStmt *pstmt, const char *queryString,
						bool readOnlyTree, ProcessUtilityContext context,
						ParamListInfo params, QueryEnvironment *queryEnv,
						DestReceiver *dest, QueryCompletion *qc)
{
	int			saved_depth = idem_ddl_depth;
	volatile bool snapshot_pushed = false;

	if (GetCommandLogLevel(pstmt->utilityStmt) != LOGSTMT_DDL)
	{
		run_utility(pstmt, queryString, readOnlyTree, context, params,
					queryEnv, dest, qc);
		return;
	}

	if (pending.active && !pending.written)
	{
		write_pending_processing();
		CommandCounterIncrement();
		/* the statement's snapshot predates the row (an abort pops this) */
		if (ActiveSnapshotSet())
		{
			PushCopiedSnapshot(GetActiveSnapshot());
			UpdateActiveSnapshotCommandId();
			snapshot_pushed = true;
		}
	}
	idem_ddl_depth++;
	PG_TRY();
	{
		run_utility(pstmt, queryString, readOnlyTree, context, params,
					queryEnv, dest, qc);
	}
	PG_FINALLY();
	{
		idem_ddl_depth = saved_depth;
	}
	PG_END_TRY();
	if (snapshot_pushed)
		PopActiveSnapshot();
}

/* Run the utility statement: through the next hook, or PostgreSQL itself. */
static void
run_utility(PlannedStmt *pstmt, const char *queryString,
			bool readOnlyTree, ProcessUtilityContext context,
			ParamListInfo params, QueryEnvironment *queryEnv,
			DestReceiver *dest, QueryCompletion *qc)
{
	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context,
							 params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
}

/*
 * Make the key lock, taken by the statement that claims, a lock of the
 * subtransaction: the statement's resource owner gives its locks to the
 * subtransaction when it ends, so the completion, a later statement, would
 * not find it there.  (Taken once more by the subtransaction, it is held
 * already, then given back once by the statement.)
 */
static void
rehome_key_lock(const LOCKTAG *lock)
{
	ResourceOwner saved = CurrentResourceOwner;

	if (saved == CurTransactionResourceOwner)
		return;
	CurrentResourceOwner = CurTransactionResourceOwner;
	PG_TRY();
	{
		if (LockAcquire(lock, ExclusiveLock, false, true) == LOCKACQUIRE_NOT_AVAIL)
			elog(ERROR, "key lock of a pending claim not held");
	}
	PG_FINALLY();
	{
		CurrentResourceOwner = saved;
	}
	PG_END_TRY();
	idem_key_lock_release(lock);
}

/*
 * Forget the pending claim (not the key lock, which its holder releases).
 */
static void
forget(void)
{
	pending.active = false;
	pending.written = false;
	if (pending_context != NULL)
		MemoryContextReset(pending_context);
}

static text *
copy_text(const text *t)
{
	Size		len = VARSIZE_ANY(t);
	text	   *copy = palloc(len);

	memcpy(copy, t, len);
	return copy;
}

/*
 * Compare two token secrets in constant time.
 */
static bool
same_secret(const uint8 *a, const uint8 *b)
{
	uint8		diff = 0;
	int			i;

	for (i = 0; i < IDEM_TOKEN_SECRET_LEN; i++)
		diff |= a[i] ^ b[i];
	return diff == 0;
}

/*
 * Transaction end: a claim still pending is written before the commit (or
 * the prepare); on abort it is forgotten, and its key lock goes with the
 * transaction's locks.  A failure of that write (or of anything else at
 * the commit) aborts the transaction, which ends here as an abort.  The
 * next transaction may keep claims pending, whichever loaded the library.
 */
static void
pending_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			if (pending.active && !pending.written)
				write_before_commit();
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			forget();
			lock_kept = false;
			loaded_in_transaction = false;
			break;
		default:
			break;
	}
}

/*
 * Subtransaction end.  Rolled back: a claim made in it is forgotten (its
 * key lock is released with the subtransaction's locks); a record written
 * in it for an older claim is gone, so that claim is pending again.
 * Released: both pass to the parent, and once the record is in the claim's
 * own subtransaction the two share their fate: the claim is done, its key
 * lock held until the transaction ends.
 */
static void
pending_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						 SubTransactionId parentSubid,
						 void *arg pg_attribute_unused())
{
	if (!pending.active)
		return;
	switch (event)
	{
		case SUBXACT_EVENT_ABORT_SUB:
			if (pending.claim_subid == mySubid)
				forget();
			else if (pending.written && pending.written_subid == mySubid)
				pending.written = false;
			break;
		case SUBXACT_EVENT_COMMIT_SUB:
			if (pending.claim_subid == mySubid)
				pending.claim_subid = parentSubid;
			if (pending.written && pending.written_subid == mySubid)
				pending.written_subid = parentSubid;
			if (pending.written && pending.written_subid == pending.claim_subid)
			{
				forget();
				lock_kept = true;
			}
			break;
		default:
			break;
	}
}
