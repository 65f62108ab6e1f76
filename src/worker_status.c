/*-------------------------------------------------------------------------
 *
 * worker_status.c
 *	  Shared-memory status of the idempotency background workers and the
 *	  SQL function idem_worker_status() that shows it.
 *
 * There is one slot per database: the worker serving that database claims
 * it when it starts (which is also how a second worker for the same
 * database is refused), updates its counters after every batch and cycle,
 * and gives it up when it exits.  The slot keeps the counters of the last
 * worker after it exited, so that its last error stays visible.  There can
 * never be more workers than max_worker_processes, hence as many slots.
 *
 * The area is requested through shmem_request_hook when the library is in
 * shared_preload_libraries.  Without the preload, the first process that
 * needs it carves it out of the spare shared memory the server keeps for
 * such late arrivals, the way contrib/pg_prewarm's autoprewarm does; it is
 * a few hundred bytes per slot.
 *
 * Locking: one LWLock protects every slot.  It is held only to copy a few
 * fields in or out, never across anything that can raise an error.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "commands/dbcommands.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "worker_status.h"

#define IDEM_STATUS_SHMEM_NAME	"idempotency worker status"
#define IDEM_STATUS_ERROR_LEN	256
#define IDEM_STATUS_COLUMNS		10

/* The status of the worker of one database. */
typedef struct IdemWorkerSlot
{
	Oid			dboid;			/* InvalidOid while the slot was never used */
	int			pid;			/* 0 when no worker runs */
	TimestampTz started_at;
	TimestampTz last_cycle_at;	/* 0 before the first cycle ends */
	int64		cycles;
	IdemWorkerProgress progress;
	TimestampTz last_error_at;	/* 0 when there was no error */
	char		last_error[IDEM_STATUS_ERROR_LEN];
} IdemWorkerSlot;

/* The whole shared area. */
typedef struct IdemWorkerStatus
{
	LWLock		lock;
	int			tranche_id;
	int			nslots;
	IdemWorkerSlot slots[FLEXIBLE_ARRAY_MEMBER];
} IdemWorkerStatus;

PG_FUNCTION_INFO_V1(idem_worker_status);

static IdemWorkerStatus *idem_status = NULL;

/* In a worker: the slot it claimed. */
static IdemWorkerSlot *my_slot = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static Size status_size(void);
static void status_shmem_request(void);
static void status_shmem_startup(void);

/*
 * Size of the shared area: one slot per possible background worker.
 */
static Size
status_size(void)
{
	return add_size(offsetof(IdemWorkerStatus, slots),
					mul_size(max_worker_processes, sizeof(IdemWorkerSlot)));
}

/*
 * Install the shared-memory hooks.  Called from _PG_init while
 * shared_preload_libraries is processed.
 */
void
idem_status_install_hooks(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = status_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = status_shmem_startup;
}

/*
 * shmem_request_hook: reserve the space for the status area.
 */
static void
status_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();

	RequestAddinShmemSpace(status_size());
}

/*
 * shmem_startup_hook: create the status area.  Runs in the postmaster at
 * start and again after every crash, when shared memory is rebuilt, so the
 * pointer inherited from before the crash is forgotten first.
 */
static void
status_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	idem_status = NULL;
	idem_status_attach();
}

/*
 * Find the status area, creating it when this is the first process to need
 * it, and make its lock known to this process.
 */
void
idem_status_attach(void)
{
	bool		found;

	if (idem_status != NULL)
		return;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	idem_status = ShmemInitStruct(IDEM_STATUS_SHMEM_NAME, status_size(), &found);
	if (!found)
	{
		memset(idem_status, 0, status_size());
		idem_status->tranche_id = LWLockNewTrancheId();
		LWLockInitialize(&idem_status->lock, idem_status->tranche_id);
		idem_status->nslots = max_worker_processes;
	}
	LWLockRelease(AddinShmemInitLock);

	LWLockRegisterTranche(idem_status->tranche_id, "idempotency");
}

/*
 * Claim the slot of a database for this worker and reset its counters.
 * Returns false, with the other worker's pid in *other_pid, when another
 * worker already serves the database.
 */
bool
idem_status_claim(Oid dboid, int *other_pid)
{
	IdemWorkerSlot *slot = NULL;
	IdemWorkerSlot *reusable = NULL;
	int			i;

	idem_status_attach();
	*other_pid = 0;

	LWLockAcquire(&idem_status->lock, LW_EXCLUSIVE);
	for (i = 0; i < idem_status->nslots; i++)
	{
		IdemWorkerSlot *s = &idem_status->slots[i];

		if (s->dboid == dboid)
		{
			slot = s;
			break;
		}
		if (reusable == NULL && (s->dboid == InvalidOid || s->pid == 0))
			reusable = s;
	}

	if (slot != NULL && slot->pid != 0 && slot->pid != MyProcPid)
	{
		*other_pid = slot->pid;
		LWLockRelease(&idem_status->lock);
		return false;
	}
	if (slot == NULL)
		slot = reusable;
	if (slot == NULL)
	{
		/* cannot happen: there are as many slots as worker processes */
		LWLockRelease(&idem_status->lock);
		elog(ERROR, "no free idempotency worker status slot");
	}

	memset(slot, 0, sizeof(IdemWorkerSlot));
	slot->dboid = dboid;
	slot->pid = MyProcPid;
	slot->started_at = GetCurrentTimestamp();
	my_slot = slot;
	LWLockRelease(&idem_status->lock);

	return true;
}

/*
 * Give up this worker's slot, keeping its counters for display.  Called
 * when the worker exits.
 */
void
idem_status_release(void)
{
	if (my_slot == NULL)
		return;

	LWLockAcquire(&idem_status->lock, LW_EXCLUSIVE);
	if (my_slot->pid == MyProcPid)
		my_slot->pid = 0;
	LWLockRelease(&idem_status->lock);
	my_slot = NULL;
}

/*
 * The pid of the worker serving a database, or 0 when none runs.
 */
int
idem_status_running_pid(Oid dboid)
{
	int			pid = 0;
	int			i;

	idem_status_attach();

	LWLockAcquire(&idem_status->lock, LW_SHARED);
	for (i = 0; i < idem_status->nslots; i++)
	{
		if (idem_status->slots[i].dboid == dboid)
		{
			pid = idem_status->slots[i].pid;
			break;
		}
	}
	LWLockRelease(&idem_status->lock);

	return pid;
}

/*
 * Add what a batch did to this worker's counters.
 */
void
idem_status_add_progress(const IdemWorkerProgress *progress)
{
	if (my_slot == NULL)
		return;

	LWLockAcquire(&idem_status->lock, LW_EXCLUSIVE);
	my_slot->progress.rows_expired += progress->rows_expired;
	my_slot->progress.rows_deleted += progress->rows_deleted;
	my_slot->progress.cleanup_batches += progress->cleanup_batches;
	LWLockRelease(&idem_status->lock);
}

/*
 * Record the end of a cycle, successful or not.
 */
void
idem_status_end_cycle(void)
{
	if (my_slot == NULL)
		return;

	LWLockAcquire(&idem_status->lock, LW_EXCLUSIVE);
	my_slot->last_cycle_at = GetCurrentTimestamp();
	my_slot->cycles++;
	LWLockRelease(&idem_status->lock);
}

/*
 * Record the message of an error that ended a cycle.
 */
void
idem_status_set_error(const char *message)
{
	if (my_slot == NULL)
		return;

	LWLockAcquire(&idem_status->lock, LW_EXCLUSIVE);
	strlcpy(my_slot->last_error, message ? message : "", IDEM_STATUS_ERROR_LEN);
	my_slot->last_error_at = GetCurrentTimestamp();
	LWLockRelease(&idem_status->lock);
}

/*
 * idem_worker_status(): one row per database that has had a worker since
 * the server started (or since its last crash).  pid is NULL when that
 * worker is no longer running; the counters are those since it started.
 */
Datum
idem_worker_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	IdemWorkerSlot *copy;
	int			nslots;
	int			i;

	InitMaterializedSRF(fcinfo, 0);
	idem_status_attach();

	/* copy the slots under the lock, look the names up without it */
	nslots = idem_status->nslots;
	copy = palloc(sizeof(IdemWorkerSlot) * nslots);
	LWLockAcquire(&idem_status->lock, LW_SHARED);
	memcpy(copy, idem_status->slots, sizeof(IdemWorkerSlot) * nslots);
	LWLockRelease(&idem_status->lock);

	for (i = 0; i < nslots; i++)
	{
		IdemWorkerSlot *s = &copy[i];
		Datum		values[IDEM_STATUS_COLUMNS];
		bool		nulls[IDEM_STATUS_COLUMNS];
		char	   *dbname;

		if (s->dboid == InvalidOid)
			continue;

		memset(nulls, 0, sizeof(nulls));
		dbname = get_database_name(s->dboid);
		if (dbname != NULL)
			values[0] = CStringGetTextDatum(dbname);
		else
			nulls[0] = true;
		values[1] = Int32GetDatum(s->pid);
		nulls[1] = (s->pid == 0);
		values[2] = TimestampTzGetDatum(s->started_at);
		values[3] = TimestampTzGetDatum(s->last_cycle_at);
		nulls[3] = (s->last_cycle_at == 0);
		values[4] = Int64GetDatum(s->cycles);
		values[5] = Int64GetDatum(s->progress.rows_expired);
		values[6] = Int64GetDatum(s->progress.rows_deleted);
		values[7] = Int64GetDatum(s->progress.cleanup_batches);
		s->last_error[IDEM_STATUS_ERROR_LEN - 1] = '\0';
		values[8] = CStringGetTextDatum(s->last_error);
		nulls[8] = (s->last_error_at == 0);
		values[9] = TimestampTzGetDatum(s->last_error_at);
		nulls[9] = (s->last_error_at == 0);

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}

	return (Datum) 0;
}
