/*-------------------------------------------------------------------------
 *
 * worker_status.c
 *	  Shared-memory status of the idempotency background workers and the
 *	  SQL function idem_worker_status() that shows it.
 *
 * There is one slot per database.  The process that serves a database
 * (the launcher, or the one idem_launch_worker() started) claims its slot
 * when it starts serving it, which is also how a second one for the same
 * database is refused, and gives it up when it exits.  Each cycle runs in a
 * short-lived worker process of its own (worker.c): it marks the slot as
 * running a cycle, adds to its counters after every batch and cycle, and
 * leaves it when it exits, so the counters and the last error outlive the
 * cycle processes.  The slot also keeps what must be logged once rather
 * than every cycle (the extension missing).  There are as many slots as
 * databases listed in idempotency.database plus max_worker_processes (one
 * per process idem_launch_worker() can start).
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
	int			pid;			/* the process serving it, 0 when none */
	int			cycle_pid;		/* the process running a cycle, or 0 */
	bool		cycle_done;		/* a cycle ended since the launcher looked */
	bool		waiting;		/* "waiting for the extension" was logged */
	TimestampTz started_at;
	TimestampTz cycle_started_at;	/* start of the cycle running */
	TimestampTz last_cycle_at;	/* start of the last cycle that ended, 0
								 * before the first */
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

/* In a cycle process: the slot of its database. */
static IdemWorkerSlot *my_slot = NULL;

/*
 * The databases idempotency.database lists, as _PG_init counted them; none
 * without the preload, where that setting is not defined.
 */
static int	status_databases = 0;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static Size status_size(void);
static IdemWorkerSlot *find_slot(Oid dboid);
static void status_shmem_request(void);
static void status_shmem_startup(void);

/*
 * The number of slots: one per database listed in idempotency.database
 * (served by the launcher) and one per process idem_launch_worker() can
 * start.  The list is fixed at server start.
 */
static int
status_nslots(void)
{
	return max_worker_processes + status_databases;
}

/*
 * Size of the shared area.
 */
static Size
status_size(void)
{
	return add_size(offsetof(IdemWorkerStatus, slots),
					mul_size(status_nslots(), sizeof(IdemWorkerSlot)));
}

/*
 * Install the shared-memory hooks, for a status area with a slot for each
 * of the database_count databases idempotency.database lists.  Called from
 * _PG_init while shared_preload_libraries is processed.
 */
void
idem_status_install_hooks(int database_count)
{
	status_databases = database_count;
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
		idem_status->nslots = status_nslots();
	}
	LWLockRelease(AddinShmemInitLock);

	LWLockRegisterTranche(idem_status->tranche_id, "idempotency");
}

/*
 * The slot of a database, or NULL when it never had one.  The caller holds
 * the lock.
 */
static IdemWorkerSlot *
find_slot(Oid dboid)
{
	int			i;

	for (i = 0; i < idem_status->nslots; i++)
		if (idem_status->slots[i].dboid == dboid)
			return &idem_status->slots[i];
	return NULL;
}

/*
 * Claim the slot of a database for this process, which serves it from now
 * on, and reset its counters.  Returns false, with the other process's pid
 * in *other_pid, when another process already serves the database.
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
		/* cannot happen: there is a slot per database a process can serve */
		LWLockRelease(&idem_status->lock);
		elog(ERROR, "no free idempotency worker status slot");
	}
	if (slot->pid == MyProcPid)
	{
		/* serving it already: keep the counters */
		LWLockRelease(&idem_status->lock);
		return true;
	}

	memset(slot, 0, sizeof(IdemWorkerSlot));
	slot->dboid = dboid;
	slot->pid = MyProcPid;
	slot->started_at = GetCurrentTimestamp();
	LWLockRelease(&idem_status->lock);

	return true;
}

/*
 * Stop serving a database (every database when dboid is InvalidOid),
 * keeping the counters for display.  Called when the serving process
 * exits or its database went away.
 */
void
idem_status_release(Oid dboid)
{
	int			i;

	if (idem_status == NULL)
		return;

	LWLockAcquire(&idem_status->lock, LW_EXCLUSIVE);
	for (i = 0; i < idem_status->nslots; i++)
	{
		IdemWorkerSlot *s = &idem_status->slots[i];

		if (s->pid == MyProcPid && (!OidIsValid(dboid) || s->dboid == dboid))
			s->pid = 0;
	}
	LWLockRelease(&idem_status->lock);
}

/*
 * In a cycle process: find the slot of its database and mark it as running
 * a cycle.  Returns false when no process serves the database any more.
 */
bool
idem_status_begin_cycle(Oid dboid)
{
	IdemWorkerSlot *slot;

	idem_status_attach();

	LWLockAcquire(&idem_status->lock, LW_EXCLUSIVE);
	slot = find_slot(dboid);
	if (slot != NULL && slot->pid != 0 && slot->cycle_pid == 0)
	{
		slot->cycle_pid = MyProcPid;
		slot->cycle_started_at = GetCurrentTimestamp();
		my_slot = slot;
	}
	LWLockRelease(&idem_status->lock);

	return my_slot != NULL;
}

/*
 * In a cycle process, when it exits: leave the slot.
 */
void
idem_status_leave_cycle(void)
{
	if (my_slot == NULL)
		return;

	LWLockAcquire(&idem_status->lock, LW_EXCLUSIVE);
	if (my_slot->cycle_pid == MyProcPid)
		my_slot->cycle_pid = 0;
	LWLockRelease(&idem_status->lock);
	my_slot = NULL;
}

/*
 * Whether a cycle process of a database ended its cycle (rather than
 * failing before or during it) since the last call.
 */
bool
idem_status_take_cycle_done(Oid dboid)
{
	IdemWorkerSlot *slot;
	bool		done = false;

	LWLockAcquire(&idem_status->lock, LW_EXCLUSIVE);
	slot = find_slot(dboid);
	if (slot != NULL)
	{
		done = slot->cycle_done;
		slot->cycle_done = false;
	}
	LWLockRelease(&idem_status->lock);

	return done;
}

/*
 * In a cycle process: note whether the extension is missing, and return
 * what was noted before, so that a change is logged once, not every cycle.
 */
bool
idem_status_note_waiting(bool waiting)
{
	bool		before;

	if (my_slot == NULL)
		return !waiting;

	LWLockAcquire(&idem_status->lock, LW_EXCLUSIVE);
	before = my_slot->waiting;
	my_slot->waiting = waiting;
	LWLockRelease(&idem_status->lock);

	return before;
}

/*
 * The pid of the process serving a database, or 0 when none does.
 */
int
idem_status_running_pid(Oid dboid)
{
	IdemWorkerSlot *slot;
	int			pid;

	idem_status_attach();

	LWLockAcquire(&idem_status->lock, LW_SHARED);
	slot = find_slot(dboid);
	pid = (slot != NULL) ? slot->pid : 0;
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
 * Record the end of a cycle, whatever its passes met; counted is false
 * when there was nothing to do (the extension is not installed).
 */
void
idem_status_end_cycle(bool counted)
{
	if (my_slot == NULL)
		return;

	LWLockAcquire(&idem_status->lock, LW_EXCLUSIVE);
	/*
	 * The start, not the end: a cycle that ended with last_cycle_at after
	 * some moment ran entirely with the settings of that moment.
	 */
	if (counted)
	{
		my_slot->last_cycle_at = my_slot->cycle_started_at;
		my_slot->cycles++;
	}
	my_slot->cycle_done = true;
	LWLockRelease(&idem_status->lock);
}

/*
 * Record the message of an error that ended a pass, or of a record that a
 * pass skipped.
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
 * idem_worker_status(): one row per database that has been served since
 * the server started (or since its last crash).  pid is the process that
 * serves it (the launcher, or the one idem_launch_worker() started), NULL
 * when none does any more; the counters are those since it started serving
 * it.
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
