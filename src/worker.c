/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  Background processes of the idempotency extension: a launcher and one
 *	  worker per database, plus idem_launch_worker().
 *
 * Design
 *
 * When the library is in shared_preload_libraries and idempotency.database
 * names at least one database, _PG_init registers one static "idempotency
 * launcher".  The launcher connects to no database (like the logical
 * replication launcher); it reads the shared catalog pg_database and starts
 * one dynamic "idempotency worker" per listed database that exists.  A
 * listed database that does not exist gets one LOG line and is looked for
 * again every few seconds, so a typo or a database created later never
 * turns into a crash loop that floods the log.  The launcher is notified
 * when one of its workers exits and starts it again, at most once every
 * IDEM_RESTART_DELAY_MS.  The launcher itself is restarted by the
 * postmaster (bgw_restart_time); after a crash of any backend the postmaster
 * restarts it at once, and it starts the workers again.
 *
 * A worker serves one database.  Each cycle it runs the lease pass and then
 * the cleanup pass of maintenance.c, every batch in a transaction of its own,
 * then sleeps idempotency.naptime on its latch.  While the extension is not
 * installed in its database it says so once in the log and keeps checking
 * every naptime, which also covers DROP EXTENSION and a later CREATE
 * EXTENSION.  An error inside a cycle is caught, logged, kept in the status
 * (worker_status.c) and the worker goes on with the next cycle.
 *
 * idem_launch_worker() starts a worker for the current database from SQL,
 * without a restart, as contrib/pg_prewarm's autoprewarm_start_worker()
 * does.  Such a worker is not supervised by the launcher: it lasts until it
 * is terminated or the server stops or crashes.
 *
 * At most one worker serves a database: a worker claims its database's
 * status slot when it starts and exits quietly when another worker holds
 * it.  Launcher and workers start only once recovery has finished, so they
 * never run on a standby.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/varlena.h"

#include "idempotency.h"
#include "maintenance.h"
#include "worker.h"
#include "worker_status.h"

/* seconds before the postmaster restarts a launcher that failed */
#define IDEM_LAUNCHER_RESTART_S		5
/* launcher: how often it looks at its workers and the missing databases */
#define IDEM_LAUNCHER_NAPTIME_MS	1000
/* launcher: least time between two starts of one database's worker */
#define IDEM_RESTART_DELAY_MS		5000

#define IDEM_LAUNCHER_NAME			"idempotency launcher"
#define IDEM_WORKER_TYPE			"idempotency worker"

/* The launcher's view of one database named in idempotency.database. */
typedef struct LauncherEntry
{
	char	   *dbname;
	BackgroundWorkerHandle *handle; /* the worker it started, if any */
	TimestampTz last_attempt;	/* when it last tried to start one */
	bool		reported_missing;	/* LOG said the database does not exist */
	bool		reported_no_slot;	/* LOG said there is no worker slot */
} LauncherEntry;

PGDLLEXPORT void idem_launcher_main(Datum main_arg);
PGDLLEXPORT void idem_worker_main(Datum main_arg);

PG_FUNCTION_INFO_V1(idem_launch_worker);

/* In a worker: the name of its database, for log messages. */
static char *worker_dbname = NULL;

/* In a worker: whether the "waiting for the extension" line was logged. */
static bool reported_waiting = false;

static List *database_list(bool report);
static void init_worker(BackgroundWorker *worker, const char *function,
						int restart_time);
static bool start_worker(Oid dboid, const char *dbname, pid_t notify_pid,
						 BackgroundWorkerHandle **handle);
static void launcher_pass(LauncherEntry *entries, int nentries);
static Oid	lookup_database(const char *dbname);
static char *settings_summary(void);
static bool settings_changed(void);
static void worker_shmem_exit(int code, Datum arg);
static void run_cycle(MemoryContext cycle_context);
static bool run_pass(IdemPass pass, IdemWorkerProgress *cycle_progress);
static int64 run_batch_transaction(IdemPassRun *run, int limit, bool *more);
static void report_pass_error(IdemPass pass, MemoryContext cycle_context);

/*
 * The databases named in idempotency.database, as a list of palloc'd
 * strings (names are case-sensitive; double quotes are allowed).  NIL, with
 * a LOG line when report is true, when the list cannot be parsed.
 */
static List *
database_list(bool report)
{
	char	   *raw;
	List	   *names = NIL;

	if (idem_worker_databases == NULL)
		return NIL;

	raw = pstrdup(idem_worker_databases);
	if (!SplitGUCList(raw, ',', &names))
	{
		if (report)
			ereport(LOG,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid list syntax in parameter \"%s\"",
							"idempotency.database"),
					 errdetail("The idempotency background worker does not start.")));
		return NIL;
	}

	return names;
}

/*
 * Register the launcher when idempotency.database names any database.
 * Called from _PG_init while shared_preload_libraries is processed.
 */
void
idem_register_workers(void)
{
	BackgroundWorker worker;

	if (database_list(true) == NIL)
		return;

	init_worker(&worker, "idem_launcher_main", IDEM_LAUNCHER_RESTART_S);
	strlcpy(worker.bgw_name, IDEM_LAUNCHER_NAME, BGW_MAXLEN);
	strlcpy(worker.bgw_type, IDEM_LAUNCHER_NAME, BGW_MAXLEN);

	RegisterBackgroundWorker(&worker);
}

/*
 * What the launcher and the workers have in common: a database connection,
 * started once recovery has finished, running a function of this library.
 */
static void
init_worker(BackgroundWorker *worker, const char *function, int restart_time)
{
	memset(worker, 0, sizeof(*worker));
	worker->bgw_flags = BGWORKER_SHMEM_ACCESS |
		BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker->bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker->bgw_restart_time = restart_time;
	strlcpy(worker->bgw_library_name, IDEM_EXTENSION_NAME, BGW_MAXLEN);
	strlcpy(worker->bgw_function_name, function, BGW_MAXLEN);
}

/*
 * Register a dynamic worker for one database.  Returns false when no
 * background worker slot is free.
 */
static bool
start_worker(Oid dboid, const char *dbname, pid_t notify_pid,
			 BackgroundWorkerHandle **handle)
{
	BackgroundWorker worker;

	init_worker(&worker, "idem_worker_main", BGW_NEVER_RESTART);
	snprintf(worker.bgw_name, BGW_MAXLEN, "idempotency worker for database %s",
			 dbname);
	strlcpy(worker.bgw_type, IDEM_WORKER_TYPE, BGW_MAXLEN);
	worker.bgw_main_arg = ObjectIdGetDatum(dboid);
	worker.bgw_notify_pid = notify_pid;

	return RegisterDynamicBackgroundWorker(&worker, handle);
}

/*
 * Entry point of the launcher.
 */
void
idem_launcher_main(Datum main_arg pg_attribute_unused())
{
	MemoryContext pass_context;
	LauncherEntry *entries;
	List	   *names;
	ListCell   *lc;
	int			nentries = 0;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	/* no database: the launcher reads shared catalogs only */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname(IDEM_LAUNCHER_NAME);
	idem_status_attach();

	names = database_list(false);
	entries = palloc0(sizeof(LauncherEntry) * Max(list_length(names), 1));
	foreach(lc, names)
		entries[nentries++].dbname = pstrdup((char *) lfirst(lc));

	ereport(LOG,
			(errmsg("idempotency launcher started"),
			 errdetail("Databases served: %s.", idem_worker_databases)));

	pass_context = AllocSetContextCreate(TopMemoryContext,
										 "idempotency launcher pass",
										 ALLOCSET_DEFAULT_SIZES);
	for (;;)
	{
		MemoryContext oldcontext;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		MemoryContextReset(pass_context);
		oldcontext = MemoryContextSwitchTo(pass_context);
		launcher_pass(entries, nentries);
		MemoryContextSwitchTo(oldcontext);

		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 IDEM_LAUNCHER_NAPTIME_MS,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/*
 * One look of the launcher at every database it serves: start a worker for
 * each one that exists and has none.
 */
static void
launcher_pass(LauncherEntry *entries, int nentries)
{
	TimestampTz now = GetCurrentTimestamp();
	int			i;

	for (i = 0; i < nentries; i++)
	{
		LauncherEntry *e = &entries[i];
		MemoryContext oldcontext;
		bool		started;
		Oid			dboid;

		if (e->handle != NULL)
		{
			pid_t		pid;
			BgwHandleStatus status = GetBackgroundWorkerPid(e->handle, &pid);

			if (status == BGWH_STARTED || status == BGWH_NOT_YET_STARTED)
				continue;

			/*
			 * The worker exited.  Wait IDEM_RESTART_DELAY_MS from now before
			 * starting another, which also leaves DROP DATABASE ... WITH
			 * (FORCE) the time to finish.
			 */
			pfree(e->handle);
			e->handle = NULL;
			e->last_attempt = now;
			continue;
		}

		if (!TimestampDifferenceExceeds(e->last_attempt, now,
										IDEM_RESTART_DELAY_MS))
			continue;
		e->last_attempt = now;

		dboid = lookup_database(e->dbname);
		if (!OidIsValid(dboid))
		{
			if (!e->reported_missing)
				ereport(LOG,
						(errcode(ERRCODE_UNDEFINED_DATABASE),
						 errmsg("database \"%s\" named in idempotency.database does not exist",
								e->dbname),
						 errdetail("Its idempotency worker starts when the database is created."),
						 errhint("Check the names listed in idempotency.database.")));
			e->reported_missing = true;
			continue;
		}
		if (e->reported_missing)
			ereport(LOG,
					(errmsg("database \"%s\" named in idempotency.database now exists",
							e->dbname)));
		e->reported_missing = false;

		/* a worker started with idem_launch_worker() may serve it already */
		if (idem_status_running_pid(dboid) != 0)
			continue;

		/* the handle must outlive this pass */
		oldcontext = MemoryContextSwitchTo(TopMemoryContext);
		started = start_worker(dboid, e->dbname, MyProcPid, &e->handle);
		MemoryContextSwitchTo(oldcontext);
		if (!started)
		{
			e->handle = NULL;
			if (!e->reported_no_slot)
				ereport(LOG,
						(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
						 errmsg("could not start the idempotency worker for database \"%s\"",
								e->dbname),
						 errdetail("No background worker slot is free; the launcher tries again."),
						 errhint("You may need to increase max_worker_processes.")));
			e->reported_no_slot = true;
			continue;
		}
		e->reported_no_slot = false;
	}
}

/*
 * The OID of a database, or InvalidOid when there is none of that name.
 *
 * A process connected to no database cannot use catalog indexes, so this
 * reads pg_database sequentially, as the autovacuum launcher's
 * get_database_list() does; the table is small.
 */
static Oid
lookup_database(const char *dbname)
{
	MemoryContext pass_context = CurrentMemoryContext;
	Oid			dboid = InvalidOid;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tuple;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	(void) GetTransactionSnapshot();

	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while (HeapTupleIsValid(tuple = heap_getnext(scan, ForwardScanDirection)))
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tuple);

		if (strcmp(NameStr(db->datname), dbname) == 0)
		{
			dboid = db->oid;
			break;
		}
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);

	CommitTransactionCommand();
	MemoryContextSwitchTo(pass_context);

	return dboid;
}

/*
 * Entry point of the worker of one database, whose OID is main_arg.
 */
void
idem_worker_main(Datum main_arg)
{
	Oid			dboid = DatumGetObjectId(main_arg);
	MemoryContext cycle_context;
	int			other_pid;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);
	pgstat_report_appname(IDEM_WORKER_TYPE);

	StartTransactionCommand();
	worker_dbname = MemoryContextStrdup(TopMemoryContext,
										get_database_name(MyDatabaseId));
	CommitTransactionCommand();

	if (!idem_status_claim(MyDatabaseId, &other_pid))
	{
		ereport(LOG,
				(errmsg("idempotency worker for database \"%s\" exits: another worker serves this database",
						worker_dbname),
				 errdetail("The worker with PID %d already serves it.", other_pid)));
		proc_exit(0);
	}
	before_shmem_exit(worker_shmem_exit, (Datum) 0);

	ereport(LOG,
			(errmsg("idempotency worker started for database \"%s\"",
					worker_dbname),
			 errdetail_internal("%s", settings_summary())));
	settings_changed();

	cycle_context = AllocSetContextCreate(TopMemoryContext,
										  "idempotency worker cycle",
										  ALLOCSET_DEFAULT_SIZES);
	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			if (settings_changed())
				ereport(LOG,
						(errmsg("idempotency worker for database \"%s\" reloaded its settings",
								worker_dbname),
						 errdetail_internal("%s", settings_summary())));
		}

		MemoryContextReset(cycle_context);
		run_cycle(cycle_context);

		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 idem_naptime_ms,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/*
 * The worker's settings, for its log lines.
 */
static char *
settings_summary(void)
{
	return psprintf("naptime %d ms, cleanup batch size %d, at most %d batches per pass, cleanup grace %d s, cleanup delay %d ms.",
					idem_naptime_ms, idem_cleanup_batch_size,
					idem_cleanup_max_batches, idem_cleanup_grace_s,
					idem_cleanup_delay_ms);
}

/*
 * Whether the worker's settings changed since the last call.
 */
static bool
settings_changed(void)
{
	static int	last[5] = {-1, -1, -1, -1, -1};
	int			now[5];
	bool		changed;

	now[0] = idem_naptime_ms;
	now[1] = idem_cleanup_batch_size;
	now[2] = idem_cleanup_max_batches;
	now[3] = idem_cleanup_grace_s;
	now[4] = idem_cleanup_delay_ms;
	changed = memcmp(last, now, sizeof(now)) != 0;
	memcpy(last, now, sizeof(now));

	return changed;
}

/*
 * before_shmem_exit callback of a worker: give up its status slot.
 */
static void
worker_shmem_exit(int code pg_attribute_unused(),
				  Datum arg pg_attribute_unused())
{
	idem_status_release();
}

/*
 * One cycle: the lease pass, then the cleanup pass.  Each pass catches its
 * own error, so that neither ever keeps the other from running; the error
 * is logged and kept in the status, and the pass runs again in the next
 * cycle.
 */
static void
run_cycle(MemoryContext cycle_context)
{
	MemoryContext oldcontext = MemoryContextSwitchTo(cycle_context);
	IdemWorkerProgress progress = {0};
	volatile bool installed = true;
	volatile IdemPass pass;

	if (RecoveryInProgress())
	{
		/* cannot happen: the worker starts once recovery has finished */
		MemoryContextSwitchTo(oldcontext);
		return;
	}

	for (pass = IDEM_PASS_LEASES; pass < IDEM_NUM_PASSES && installed; pass++)
	{
		PG_TRY();
		{
			installed = run_pass(pass, &progress);
		}
		PG_CATCH();
		{
			report_pass_error(pass, cycle_context);
		}
		PG_END_TRY();
	}

	if (installed)
	{
		idem_status_end_cycle();
		ereport(DEBUG1,
				(errmsg_internal("idempotency worker for database \"%s\": %lld leases expired, %lld records deleted in %lld batches",
								 worker_dbname,
								 (long long) progress.rows_expired,
								 (long long) progress.rows_deleted,
								 (long long) progress.cleanup_batches)));
	}

	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	MemoryContextSwitchTo(oldcontext);
}

/*
 * One pass of a cycle: batches of idempotency.cleanup_batch_size rows, each
 * in its own transaction, until a batch finds fewer rows or
 * idempotency.cleanup_max_batches batches ran.  Adds what it did to the
 * cycle's progress and to the status.  Returns false when the extension is
 * not installed (nothing was done).
 */
static bool
run_pass(IdemPass pass, IdemWorkerProgress *cycle_progress)
{
	IdemPassRun run;
	int64		pass_rows = 0;
	int			batches = 0;
	bool		more = true;

	idem_pass_begin(&run, pass);
	while (more)
	{
		int64		n;
		IdemWorkerProgress batch = {0};

		CHECK_FOR_INTERRUPTS();
		n = run_batch_transaction(&run, idem_cleanup_batch_size, &more);
		if (n < 0)
			return false;

		batches++;
		pass_rows += n;
		if (pass == IDEM_PASS_LEASES)
			batch.rows_expired = n;
		else
		{
			batch.rows_deleted = n;
			batch.cleanup_batches = (n > 0) ? 1 : 0;
		}
		idem_status_add_progress(&batch);
		cycle_progress->rows_expired += batch.rows_expired;
		cycle_progress->rows_deleted += batch.rows_deleted;
		cycle_progress->cleanup_batches += batch.cleanup_batches;

		if (!more)
			break;
		if (batches >= idem_cleanup_max_batches)
		{
			if (pass == IDEM_PASS_CLEANUP)
				ereport(LOG,
						(errmsg("idempotency worker for database \"%s\" reached idempotency.cleanup_max_batches: %lld expired records deleted in %d batches, the rest waits for the next cycle",
								worker_dbname, (long long) pass_rows, batches),
						 errhint("Raise idempotency.cleanup_max_batches or lower idempotency.naptime if the backlog keeps growing.")));
			break;
		}

		/* a latch set by SIGHUP or SIGTERM cuts the pause short */
		if (pass == IDEM_PASS_CLEANUP && idem_cleanup_delay_ms > 0)
		{
			(void) WaitLatch(MyLatch,
							 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 idem_cleanup_delay_ms,
							 PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
		}
	}

	if (pass == IDEM_PASS_LEASES && pass_rows > 0)
		ereport(LOG,
				(errmsg("idempotency worker for database \"%s\" expired %lld leases",
						worker_dbname, (long long) pass_rows)));

	/* the skipped records were logged one by one; the status keeps the last */
	if (run.nskipped > 0)
		idem_status_set_error(run.last_skip);

	return true;
}

/*
 * One batch of a pass in a transaction of its own.  Returns the number of
 * rows changed, with *more as idem_pass_batch() sets it, or -1 when the
 * extension is not installed (logged once until it is).
 */
static int64
run_batch_transaction(IdemPassRun *run, int limit, bool *more)
{
	MemoryContext cycle_context = CurrentMemoryContext;
	Oid			extoid;
	int64		n = -1;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());

	extoid = idem_installed_extension();
	if (!OidIsValid(extoid))
	{
		idem_maintenance_forget();
		if (!reported_waiting)
			ereport(LOG,
					(errmsg("idempotency worker for database \"%s\" is waiting for extension \"%s\" to be installed",
							worker_dbname, IDEM_EXTENSION_NAME),
					 errhint("Run CREATE EXTENSION %s in database \"%s\".",
							 IDEM_EXTENSION_NAME, worker_dbname)));
		reported_waiting = true;
	}
	else
	{
		if (reported_waiting)
			ereport(LOG,
					(errmsg("idempotency worker for database \"%s\" found extension \"%s\" and starts its maintenance",
							worker_dbname, IDEM_EXTENSION_NAME)));
		reported_waiting = false;

		idem_maintenance_prepare(extoid);
		pgstat_report_activity(STATE_RUNNING,
							   run->pass == IDEM_PASS_LEASES
							   ? "idempotency: expiring leases"
							   : "idempotency: deleting expired records");
		n = idem_pass_batch(run, limit, more);
	}

	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	/* the commit leaves TopMemoryContext current */
	MemoryContextSwitchTo(cycle_context);

	return n;
}

/*
 * Called in PG_CATCH: abort the transaction, log the error (its message
 * only, never a detail that might quote a key or a body) and keep it in the
 * status.
 */
static void
report_pass_error(IdemPass pass, MemoryContext cycle_context)
{
	ErrorData  *edata;

	HOLD_INTERRUPTS();
	MemoryContextSwitchTo(cycle_context);
	edata = CopyErrorData();
	FlushErrorState();
	AbortOutOfAnyTransaction();
	MemoryContextSwitchTo(cycle_context);
	RESUME_INTERRUPTS();

	idem_status_set_error(edata->message);
	ereport(LOG,
			(errcode(edata->sqlerrcode),
			 errmsg("idempotency worker for database \"%s\" failed a cycle: %s",
					worker_dbname, edata->message),
			 errdetail("The %s pass stopped; the worker tries it again after idempotency.naptime.",
					   pass == IDEM_PASS_LEASES ? "lease expiry" : "cleanup")));
}

/*
 * idem_launch_worker() returns integer
 *
 * Start the worker of the current database without a restart, and return
 * its pid.  Refuses when a worker already serves this database.
 */
Datum
idem_launch_worker(PG_FUNCTION_ARGS)
{
	BackgroundWorkerHandle *handle;
	BgwHandleStatus status;
	char	   *dbname = get_database_name(MyDatabaseId);
	pid_t		pid;
	int			running;

	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("cannot start the idempotency worker during recovery"),
				 errhint("The worker runs on the primary only.")));

	running = idem_status_running_pid(MyDatabaseId);
	if (running != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("an idempotency worker is already running in database \"%s\"",
						dbname),
				 errdetail("Its process ID is %d.", running)));

	if (!start_worker(MyDatabaseId, dbname, MyProcPid, &handle))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
				 errmsg("could not register background process"),
				 errhint("You may need to increase max_worker_processes.")));

	status = WaitForBackgroundWorkerStartup(handle, &pid);
	if (status == BGWH_POSTMASTER_DIED)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
				 errmsg("cannot start background processes without postmaster"),
				 errhint("Kill all remaining database processes and restart the database.")));

	/*
	 * Wait until the worker has claimed the database, or has given way to a
	 * worker that a concurrent call or the launcher started meanwhile.
	 */
	while (status == BGWH_STARTED)
	{
		pid_t		current;

		if (idem_status_running_pid(MyDatabaseId) == pid)
			PG_RETURN_INT32(pid);

		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 10L, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		status = GetBackgroundWorkerPid(handle, &current);
	}

	running = idem_status_running_pid(MyDatabaseId);
	if (running != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("an idempotency worker is already running in database \"%s\"",
						dbname),
				 errdetail("Its process ID is %d.", running)));
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("could not start the idempotency worker"),
			 errhint("More details may be available in the server log.")));
	PG_RETURN_NULL();			/* keep the compiler quiet */
}
