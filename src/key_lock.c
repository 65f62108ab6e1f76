/*-------------------------------------------------------------------------
 *
 * key_lock.c
 *	  A transaction-scoped lock on the hash of a scope and key (the calling
 *	  role included), taken by a claim before it writes.
 *
 * A plain INSERT ... ON CONFLICT waits until the transaction that inserted
 * the same key ends.  A claim must not: with wait = 0 it answers in_progress
 * at once.  So before writing, a claim takes this lock without waiting; a
 * claim that cannot get it knows another transaction is writing the same
 * key and has not committed yet.  The lock is released exactly when the
 * claiming transaction commits or aborts, which is also when its write
 * becomes visible or disappears.
 *
 * The tag is an advisory lock tag whose fourth field is IDEM_LOCK_CLASS:
 * pg_advisory_lock() uses 1 and 2 there, so the two never collide.  In
 * pg_locks these show as locktype "advisory" with objsubid 478.
 *
 * A claim with wait > 0 waits for the lock to be free for real (a lock wait
 * that pg_locks and the deadlock detector see) up to its deadline, then
 * reads the record again.  PostgreSQL's
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

	h = hash_text(scope->role, 0);
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
 * Wait up to timeout_ms for transaction xid (one that changed or locked a
 * record) to end, as XactLockTableWait waits for a row's updater, but
 * bounded.  A subtransaction's xid is waited for through its top-level
 * transaction, which holds the row until it ends.  Returns true when it
 * ended in time (or had already ended).
 */
bool
idem_xact_wait(TransactionId xid, int timeout_ms)
{
	LOCKTAG		tag;

	if (!TransactionIdIsValid(xid) || !TransactionIdIsInProgress(xid))
		return true;
	xid = SubTransGetTopmostTransaction(xid);
	SET_LOCKTAG_TRANSACTION(tag, xid);
	return wait_for_lock(&tag, ShareLock, timeout_ms);
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
 * Give the lock back before the transaction ends; only for a claim that
 * took it and then wrote nothing.
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
