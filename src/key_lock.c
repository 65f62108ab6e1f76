/*-------------------------------------------------------------------------
 *
 * key_lock.c
 *	  A short lock on the hash of a scope and key (the calling role
 *	  included), held by a claim from the moment it finds no record until
 *	  its new record is in the unique index, and the waits of a claim for
 *	  another transaction that is writing its key.
 *
 * A plain INSERT ... ON CONFLICT waits until the transaction that inserted
 * the same key ends.  A claim must not: with wait = 0 it answers in_progress
 * at once.  It finds out the way check_exclusion_or_unique_constraint and
 * speculative insertion do: a probe of the unique index with a dirty
 * snapshot shows a row that another transaction inserted and has not
 * committed, with that transaction's id, and the transaction's own lock
 * (the one XactLockTableWait waits on) says when it ends.
 *
 * The probe alone does not decide that a key is free: records.c (key_held)
 * says what does, and why this lock is taken only by claims that begin a
 * record.  The probe and the insert are not atomic, so a claim that is
 * about to insert first takes the key lock, without waiting, and gives it
 * back as soon as its row is in the unique index (or it decided not to
 * insert).
 * A claim whose record is written at its completion (pending_claim.c)
 * holds the lock until then: one lock per transaction at most.
 * Two claims of one key in the same microsecond thus never both insert:
 * the second finds the lock taken (in_progress at once, or with wait > 0 a
 * wait of microseconds) or finds the first one's row.  A transaction holds
 * at most one key lock at a time whatever the number of keys it claims:
 * claims cost no lock-table entry per key, only the transaction's own id,
 * which every writing transaction holds anyway.  Claims of existing records
 * (takeovers, new attempts, reuse) take no key lock at all: they update the
 * row with FOR UPDATE SKIP LOCKED, and a row being written by another
 * transaction carries that transaction's id as its xmax.
 *
 * Subtransactions: a row inserted in a subtransaction carries the
 * subtransaction's id; idem_xact_wait waits on that id first, so a savepoint
 * rolled back ends the wait at once, and only then follows the
 * subtransaction to its top-level transaction (XactLockTableWait does the
 * same).  A prepared transaction keeps its id's lock until COMMIT PREPARED
 * or ROLLBACK PREPARED, so a claim of a key written by one answers
 * in_progress or waits, like any other uncommitted claim.
 *
 * The key lock's tag is an advisory lock tag whose fourth field is
 * IDEM_LOCK_CLASS: pg_advisory_lock() uses 1 and 2 there, so the two never
 * collide.  In pg_locks it shows as locktype "advisory" with objsubid 478,
 * for the microseconds of an insert, or from a pending claim to its
 * completion.
 *
 * A claim with wait > 0 waits for a lock for real (a lock wait that
 * pg_locks and the deadlock detector see) up to its deadline.  PostgreSQL's
 * lock manager has no timed wait, so the wait runs in a subtransaction with
 * lock_timeout set, and the timeout error is caught there.  Only claims that
 * wait pay for that subtransaction.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/subtrans.h"
#include "access/xact.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"

#include "key_lock.h"

#define IDEM_LOCK_CLASS 478

static uint64 hash_text(text *t, uint64 seed);
static bool wait_for_lock(const LOCKTAG *tag, LOCKMODE mode, int timeout_ms);

/*
 * Fill in the lock tag of a scope and key in the current database.
 */
void
idem_key_lock_tag(LOCKTAG *tag, const IdemScope *scope)
{
	uint64		h;

	h = hash_bytes_uint32_extended(scope->role, 0);
	h = hash_text(scope->tenant, h);
	h = hash_text(scope->caller, h);
	h = hash_text(scope->operation, h);
	h = hash_text(scope->key, h);
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (h >> 32), (uint32) h,
						 IDEM_LOCK_CLASS);
}

/*
 * Take the lock if nobody else holds it.  Returns false at once otherwise.
 */
bool
idem_key_lock_try(const LOCKTAG *tag)
{
	return LockAcquire(tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL;
}

/*
 * Wait up to timeout_ms for the transaction that holds the key lock to end,
 * then give the lock back at once.  Returns true when it ended in time.
 */
bool
idem_key_lock_wait(const LOCKTAG *tag, int timeout_ms)
{
	return wait_for_lock(tag, ExclusiveLock, timeout_ms);
}

/*
 * Wait up to timeout_ms for transaction xid (one that inserted, changed or
 * locked a record) to end, as XactLockTableWait waits for a row's writer,
 * but bounded.  A subtransaction is waited for itself first (a rollback to
 * its savepoint ends the wait), then through its top-level transaction,
 * which keeps a committed subtransaction's rows until it ends.  Returns
 * true when it ended in time (or had already ended).
 */
bool
idem_xact_wait(TransactionId xid, int timeout_ms)
{
	TimestampTz deadline = GetCurrentTimestamp() + (int64) timeout_ms * 1000;

	while (TransactionIdIsValid(xid) && TransactionIdIsInProgress(xid))
	{
		LOCKTAG		tag;
		int64		remaining = deadline - GetCurrentTimestamp();

		if (remaining <= 0)
			return false;
		SET_LOCKTAG_TRANSACTION(tag, xid);
		if (!wait_for_lock(&tag, ShareLock,
						   (int) Min(Max(1, remaining / 1000), PG_INT32_MAX)))
			return false;
		if (!TransactionIdIsInProgress(xid))
			break;
		/* a subtransaction that committed: its top-level transaction */
		xid = SubTransGetTopmostTransaction(xid);
	}
	return true;
}

/*
 * Acquire and release a lock, waiting at most timeout_ms (and no longer
 * than the session's own lock_timeout).  The wait shows in pg_locks as any
 * lock wait does, and a cancel interrupts it.
 */
static bool
wait_for_lock(const LOCKTAG *tag, LOCKMODE mode, int timeout_ms)
{
	MemoryContext oldcontext = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	int			saved_lock_timeout = LockTimeout;
	volatile bool acquired = false;

	if (timeout_ms <= 0)
		return false;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcontext);

	PG_TRY();
	{
		/* a shorter lock_timeout of the session still applies */
		if (LockTimeout <= 0 || LockTimeout > timeout_ms)
			LockTimeout = timeout_ms;
		(void) LockAcquire(tag, mode, false, false);

		/*
		 * The lock timeout may have fired as the lock was granted, after the
		 * wait's last check for interrupts: it left only a pending cancel,
		 * which must be taken here, as the end of the wait, and not by the
		 * caller's next check.
		 */
		CHECK_FOR_INTERRUPTS();
		LockTimeout = saved_lock_timeout;
		LockRelease(tag, mode, false);

		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;
		acquired = true;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		LockTimeout = saved_lock_timeout;
		MemoryContextSwitchTo(oldcontext);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;

		if (edata->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
			ReThrowError(edata);
		FreeErrorData(edata);
	}
	PG_END_TRY();

	return acquired;
}

/*
 * Give the key lock back: the claim's row is in the unique index, where
 * every later claim's probe finds it, or the claim wrote nothing.
 */
void
idem_key_lock_release(const LOCKTAG *tag)
{
	LockRelease(tag, ExclusiveLock, false);
}

static uint64
hash_text(text *t, uint64 seed)
{
	uint64		h = hash_bytes_extended((const unsigned char *) VARDATA_ANY(t),
										VARSIZE_ANY_EXHDR(t), seed);

	return hash_combine64(seed, h);
}
