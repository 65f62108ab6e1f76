/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  Background processes of the idempotency extension: launchers that
 *	  schedule the cycles, one short-lived worker process per cycle, and
 *	  idem_launch_worker().
 *
 * Design
 *
 * When the library is in shared_preload_libraries and idempotency.database
 * names at least one database, _PG_init registers one static "idempotency
 * launcher".  The launcher connects to no database (like the logical
 * replication launcher and the autovacuum launcher): it reads the shared
 * catalog pg_database only.  For each database listed (each name once),
 * every idempotency.naptime, it starts a dynamic "idempotency worker" that
 * connects to that database, runs one cycle and exits.  So between cycles
 * no process of ours is connected to the database, and ALTER DATABASE ...
 * RENAME, CREATE DATABASE ... TEMPLATE and DROP DATABASE by its owner work
 * as in a database without the extension; a cycle that is running when one
 * of them starts is waited for (they wait up to 5 seconds for other
 * sessions to leave), and a cycle that would start meanwhile waits for the
 * command's lock on the database.  A fresh process per cycle also means
 * that nothing a cycle cached (kept plans, the schema's name) can outlive a
 * change to the database.
 *
 * A listed database that does not exist, or does not allow connections
 * (ALLOW_CONNECTIONS false), is logged once and looked at again every few
 * seconds, never turned into a crash loop or a FATAL every cycle.  After a
 * cycle process that failed (it did not end its cycle), the next starts
 * IDEM_RESTART_DELAY_MS later at the earliest, whatever the naptime.  The
 * launcher itself is restarted by the postmaster (bgw_restart_time); after
 * a crash of any backend the postmaster restarts it at once.
 *
 * A cycle runs the lease pass and then the cleanup pass of maintenance.c,
 * every batch in a transaction of its own, each pass catching its own
 * error: an error is logged, kept in the status (worker_status.c) and the
 * pass runs again in the next cycle.  While the extension is not installed
 * in the database, the cycle says so once in the log (the status slot
 * remembers it across cycle processes), which also covers DROP EXTENSION
 * and a later CREATE EXTENSION.
 *
 * idem_launch_worker() starts, from SQL and without a restart, a launcher
 * for the current database only, as contrib/pg_prewarm's
 * autoprewarm_start_worker() starts its worker.  It serves the database by
 * its OID (a rename does not matter to it) and is not supervised: it lasts
 * until it is terminated, the database is dropped, or the server stops or
 * crashes.
 *
 * At most one launcher serves a database: it claims the database's status
 * slot before it starts cycles there, and a launcher that finds the slot
 * taken leaves the database alone.  Launchers and workers start only once
 * recovery has finished, so they never run on a standby.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

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
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/varlena.h"

#include "catalog.h"
#include "maintenance.h"
#include "worker.h"
#include "worker_status.h"

/* seconds before the postmaster restarts a launcher that failed */
#define IDEM_LAUNCHER_RESTART_S		5
/* launcher: longest sleep between two looks at its databases */
#define IDEM_LAUNCHER_NAPTIME_MS	1000
/*
 * launcher: least time between a failed cycle process and the next, and
 * between two looks at a database that is missing, refuses connections or
 * is served by another process
 */
#define IDEM_RESTART_DELAY_MS		5000

#define IDEM_LAUNCHER_NAME			"idempotency launcher"
#define IDEM_WORKER_TYPE			"idempotency worker"

/* The launcher's view of one database it serves. */
typedef struct LauncherEntry
{
	char	   *dbname;			/* as listed; the current name when by OID */
	Oid			fixed_oid;		/* served by OID (idem_launch_worker) */
	Oid			dboid;			/* the database found, whose slot we hold */
	BackgroundWorkerHandle *handle; /* the cycle process running, if any */
	TimestampTz next_cycle;		/* when the next cycle may start */
	bool		rerun;			/* settings reloaded while a cycle ran */
	bool		reported_missing;	/* LOG said the database does not exist */
	bool		reported_noconn;	/* LOG said it refuses connections */
	bool		reported_no_slot;	/* LOG said there is no worker slot */
} LauncherEntry;

/* What the launcher found of a database in pg_database. */
typedef struct DatabaseInfo
{
	Oid			oid;			/* InvalidOid when there is none */
	bool		allow_connections;
	NameData	name;
} DatabaseInfo;

PGDLLEXPORT void idem_launcher_main(Datum main_arg);
PGDLLEXPORT void idem_worker_main(Datum main_arg);

PG_FUNCTION_INFO_V1(idem_launch_worker);

/* In a cycle process: the name of its database, for log messages. */
char	   *idem_worker_databases = NULL;
int			idem_naptime_ms = 10 * 1000;
int			idem_cleanup_delay_ms = 50;

static char *worker_dbname = NULL;

static List *database_list(bool report);
static void init_worker(BackgroundWorker *worker, const char *function,
						int restart_time);
static bool start_process(const char *function, Oid dboid, const char *name,
						  const char *type, BackgroundWorkerHandle **handle);
static int	launcher_entries(Oid fixed_oid, LauncherEntry **entries);
static long launcher_pass(LauncherEntry *entries, int nentries);
static long serve_database(LauncherEntry *e, TimestampTz now);
static void lookup_database(const char *dbname, Oid dboid, DatabaseInfo *info);
static char *settings_summary(void);
static bool settings_changed(void);
static void launcher_shmem_exit(int code, Datum arg);
static void worker_shmem_exit(int code, Datum arg);
static void run_cycle(MemoryContext cycle_context);
static bool run_pass(IdemPass pass, IdemWorkerProgress *cycle_progress);
static int64 run_batch_transaction(IdemPassRun *run, int limit, bool *more);
static void report_pass_error(IdemPass pass, MemoryContext cycle_context);

/*
 * The databases named in idempotency.database, each name once, as a list
 * of palloc'd strings (names are case-sensitive; double quotes are
 * allowed).  NIL, with a LOG line when report is true, when the list cannot
 * be parsed.
 */
static List *
database_list(bool report)
{
	char	   *raw;
	List	   *names = NIL;
	List	   *unique = NIL;
	ListCell   *lc;

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

	/* a name listed twice is served once */
	foreach(lc, names)
	{
		char	   *name = (char *) lfirst(lc);
		ListCell   *seen;
		bool		duplicate = false;

		foreach(seen, unique)
			duplicate |= (strcmp((char *) lfirst(seen), name) == 0);
		if (!duplicate)
			unique = lappend(unique, name);
	}

	return unique;
}

/*
 * How many databases idempotency.database names, each counted once.
 */
int
idem_worker_database_count(void)
{
	return list_length(database_list(false));
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
	worker.bgw_main_arg = ObjectIdGetDatum(InvalidOid);

	RegisterBackgroundWorker(&worker);
}

/*
 * What the launchers and the workers have in common: a database connection
 * (to no database for the launchers), started once recovery has finished,
 * running a function of this library.
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
 * Register a dynamic process for one database, never restarted, that tells
 * this process when it starts and exits.  Returns false when no background
 * worker slot is free.
 */
static bool
start_process(const char *function, Oid dboid, const char *name,
			  const char *type, BackgroundWorkerHandle **handle)
{
	BackgroundWorker worker;

	init_worker(&worker, function, BGW_NEVER_RESTART);
	snprintf(worker.bgw_name, BGW_MAXLEN, "%s for database %s", type, name);
	strlcpy(worker.bgw_type, type, BGW_MAXLEN);
	worker.bgw_main_arg = ObjectIdGetDatum(dboid);
	worker.bgw_notify_pid = MyProcPid;

	return RegisterDynamicBackgroundWorker(&worker, handle);
}

/*
 * Entry point of a launcher: the static one (main_arg InvalidOid) serves
 * the databases of idempotency.database; one started by
 * idem_launch_worker() serves the database whose OID is main_arg.
 */
void
idem_launcher_main(Datum main_arg)
{
	Oid			fixed_oid = DatumGetObjectId(main_arg);
	MemoryContext pass_context;
	LauncherEntry *entries;
	int			nentries;
	StringInfoData served;
	int			i;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	/* no database: the launcher reads shared catalogs only */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname(IDEM_LAUNCHER_NAME);
	idem_status_attach();
	before_shmem_exit(launcher_shmem_exit, (Datum) 0);

	nentries = launcher_entries(fixed_oid, &entries);
	settings_changed();
	initStringInfo(&served);
	for (i = 0; i < nentries; i++)
		appendStringInfo(&served, "%s%s", i > 0 ? ", " : "",
						 quote_identifier(entries[i].dbname));
	ereport(LOG,
			(errmsg("idempotency launcher started"),
			 errdetail_internal("Databases served: %s; %s", served.data,
								settings_summary())));

	pass_context = AllocSetContextCreate(TopMemoryContext,
										 "idempotency launcher pass",
										 ALLOCSET_DEFAULT_SIZES);
	for (;;)
	{
		MemoryContext oldcontext;
		long		sleep_ms;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			if (settings_changed())
			{
				ereport(LOG,
						(errmsg("idempotency launcher reloaded its settings"),
						 errdetail_internal("%s", settings_summary())));
				/*
				 * A cycle now (after the one running, if any), then the
				 * new naptime.
				 */
				for (i = 0; i < nentries; i++)
				{
					entries[i].next_cycle = 0;
					entries[i].rerun = true;
				}
			}
		}

		MemoryContextReset(pass_context);
		oldcontext = MemoryContextSwitchTo(pass_context);
		sleep_ms = launcher_pass(entries, nentries);
		MemoryContextSwitchTo(oldcontext);

		/* a cycle process that starts or exits sets the latch */
		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 sleep_ms,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/*
 * The launcher's entries: one per database listed, or the one database of
 * a launcher started by idem_launch_worker() (which exits when that
 * database no longer exists).
 */
static int
launcher_entries(Oid fixed_oid, LauncherEntry **entries)
{
	List	   *names;
	ListCell   *lc;
	int			n = 0;

	if (OidIsValid(fixed_oid))
	{
		DatabaseInfo info;

		lookup_database(NULL, fixed_oid, &info);
		if (!OidIsValid(info.oid))
			proc_exit(0);
		*entries = palloc0(sizeof(LauncherEntry));
		(*entries)[0].fixed_oid = fixed_oid;
		(*entries)[0].dbname = pstrdup(NameStr(info.name));
		return 1;
	}

	names = database_list(false);
	*entries = palloc0(sizeof(LauncherEntry) * Max(list_length(names), 1));
	foreach(lc, names)
		(*entries)[n++].dbname = pstrdup((char *) lfirst(lc));
	return n;
}

/*
 * One look of the launcher at every database it serves: start a cycle
 * where one is due.  Returns how long to sleep until the next is due.
 */
static long
launcher_pass(LauncherEntry *entries, int nentries)
{
	TimestampTz now = GetCurrentTimestamp();
	long		sleep_ms = IDEM_LAUNCHER_NAPTIME_MS;
	int			i;

	for (i = 0; i < nentries; i++)
		sleep_ms = Min(sleep_ms, serve_database(&entries[i], now));

	return Max(sleep_ms, 1);
}

/*
 * The launcher's work for one database: notice that its cycle process
 * exited, and start the next cycle when it is due.  Returns the time in ms
 * until this database needs a look again.
 */
static long
serve_database(LauncherEntry *e, TimestampTz now)
{
	DatabaseInfo info;
	MemoryContext oldcontext;
	bool		started;
	int			other_pid;

	if (e->handle != NULL)
	{
		pid_t		pid;
		BgwHandleStatus status = GetBackgroundWorkerPid(e->handle, &pid);
		int			delay_ms;

		/* its exit sets our latch */
		if (status == BGWH_STARTED || status == BGWH_NOT_YET_STARTED)
			return IDEM_LAUNCHER_NAPTIME_MS;

		pfree(e->handle);
		e->handle = NULL;
		delay_ms = e->rerun ? 0 : idem_naptime_ms;
		if (!idem_status_take_cycle_done(e->dboid))
			delay_ms = Max(delay_ms, IDEM_RESTART_DELAY_MS);
		e->next_cycle = TimestampTzPlusMilliseconds(now, delay_ms);
	}

	if (now < e->next_cycle)
	{
		long		secs;
		int			usecs;

		TimestampDifference(now, e->next_cycle, &secs, &usecs);
		return secs * 1000 + usecs / 1000 + 1;
	}
	/* unless a cycle starts below, look again after the restart delay */
	e->next_cycle = TimestampTzPlusMilliseconds(now, IDEM_RESTART_DELAY_MS);

	lookup_database(OidIsValid(e->fixed_oid) ? NULL : e->dbname, e->fixed_oid,
					&info);
	if (OidIsValid(e->dboid) && e->dboid != info.oid)
	{
		/* dropped (and maybe created again under the same name) */
		idem_status_release(e->dboid);
		e->dboid = InvalidOid;
	}
	if (!OidIsValid(info.oid))
	{
		if (OidIsValid(e->fixed_oid))
		{
			ereport(LOG,
					(errmsg("idempotency launcher for database \"%s\" exits: the database no longer exists",
							e->dbname)));
			proc_exit(0);
		}
		if (!e->reported_missing)
			ereport(LOG,
					(errcode(ERRCODE_UNDEFINED_DATABASE),
					 errmsg("database \"%s\" named in idempotency.database does not exist",
							e->dbname),
					 errdetail("Its idempotency worker starts when the database is created."),
					 errhint("Check the names listed in idempotency.database.")));
		e->reported_missing = true;
		return IDEM_RESTART_DELAY_MS;
	}
	if (e->reported_missing)
		ereport(LOG,
				(errmsg("database \"%s\" named in idempotency.database now exists",
						e->dbname)));
	e->reported_missing = false;

	if (!info.allow_connections)
	{
		if (!e->reported_noconn)
			ereport(LOG,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("database \"%s\" served by the idempotency worker does not allow connections",
							NameStr(info.name)),
					 errdetail("The worker skips it until ALTER DATABASE ... ALLOW_CONNECTIONS true.")));
		e->reported_noconn = true;
		return IDEM_RESTART_DELAY_MS;
	}
	if (e->reported_noconn)
		ereport(LOG,
				(errmsg("database \"%s\" served by the idempotency worker allows connections again",
						NameStr(info.name))));
	e->reported_noconn = false;

	/* another launcher may serve it already */
	if (!idem_status_claim(info.oid, &other_pid))
	{
		if (OidIsValid(e->fixed_oid))
		{
			ereport(LOG,
					(errmsg("idempotency launcher for database \"%s\" exits: another process serves this database",
							e->dbname),
					 errdetail("The process with PID %d already serves it.",
							   other_pid)));
			proc_exit(0);
		}
		return IDEM_RESTART_DELAY_MS;
	}
	e->dboid = info.oid;

	/* the handle must outlive this pass */
	oldcontext = MemoryContextSwitchTo(TopMemoryContext);
	started = start_process("idem_worker_main", info.oid, NameStr(info.name),
							IDEM_WORKER_TYPE, &e->handle);
	MemoryContextSwitchTo(oldcontext);
	if (!started)
	{
		e->handle = NULL;
		if (!e->reported_no_slot)
			ereport(LOG,
					(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
					 errmsg("could not start the idempotency worker for database \"%s\"",
							NameStr(info.name)),
					 errdetail("No background worker slot is free; the launcher tries again."),
					 errhint("You may need to increase max_worker_processes.")));
		e->reported_no_slot = true;
		return IDEM_RESTART_DELAY_MS;
	}
	e->reported_no_slot = false;
	/* this cycle starts with the settings as they are now */
	e->rerun = false;

	return IDEM_LAUNCHER_NAPTIME_MS;
}

/*
 * Look a database up in pg_database by name, or by OID when dbname is
 * NULL.  info->oid is InvalidOid when there is none.
 *
 * A process connected to no database cannot use catalog indexes, so this
 * reads pg_database sequentially, as the autovacuum launcher's
 * get_database_list() does; the table is small.
 */
static void
lookup_database(const char *dbname, Oid dboid, DatabaseInfo *info)
{
	MemoryContext pass_context = CurrentMemoryContext;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tuple;

	memset(info, 0, sizeof(DatabaseInfo));

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	(void) GetTransactionSnapshot();

	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while (HeapTupleIsValid(tuple = heap_getnext(scan, ForwardScanDirection)))
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tuple);

		if (dbname != NULL ? strcmp(NameStr(db->datname), dbname) == 0
			: db->oid == dboid)
		{
			info->oid = db->oid;
			info->allow_connections = db->datallowconn;
			info->name = db->datname;
			break;
		}
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);

	CommitTransactionCommand();
	MemoryContextSwitchTo(pass_context);
}

/*
 * The worker's settings, for the launcher's log lines.
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
 * before_shmem_exit callback of a launcher: stop serving its databases.
 */
static void
launcher_shmem_exit(int code pg_attribute_unused(),
					Datum arg pg_attribute_unused())
{
	idem_status_release(InvalidOid);
}

/*
 * Entry point of the cycle process of one database, whose OID is main_arg:
 * one cycle, then exit.  The settings are those of the launcher when it
 * started this process.
 */
void
idem_worker_main(Datum main_arg)
{
	Oid			dboid = DatumGetObjectId(main_arg);
	MemoryContext cycle_context;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);
	pgstat_report_appname(IDEM_WORKER_TYPE);

	StartTransactionCommand();
	worker_dbname = MemoryContextStrdup(TopMemoryContext,
										get_database_name(MyDatabaseId));
	CommitTransactionCommand();

	/* the launcher that started us may have gone meanwhile */
	if (!idem_status_begin_cycle(MyDatabaseId))
		proc_exit(0);
	before_shmem_exit(worker_shmem_exit, (Datum) 0);

	cycle_context = AllocSetContextCreate(TopMemoryContext,
										  "idempotency worker cycle",
										  ALLOCSET_DEFAULT_SIZES);
	run_cycle(cycle_context);

	proc_exit(0);
}

/*
 * before_shmem_exit callback of a cycle process: leave the status slot.
 */
static void
worker_shmem_exit(int code pg_attribute_unused(),
				  Datum arg pg_attribute_unused())
{
	idem_status_leave_cycle();
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

	/* a cycle that found no extension ended all the same */
	idem_status_end_cycle(installed);
	if (installed)
	{
		ereport(DEBUG1,
				(errmsg_internal("idempotency worker for database \"%s\": %lld leases expired, %lld records deleted in %lld batches",
								 worker_dbname,
								 (long long) progress.rows_expired,
								 (long long) progress.rows_deleted,
								 (long long) progress.cleanup_batches)));
	}

	pgstat_report_stat(true);
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
			/* purged records are not deleted: they count as batches only */
			if (pass == IDEM_PASS_CLEANUP)
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
			if (pass != IDEM_PASS_LEASES)
				ereport(LOG,
						(errmsg("idempotency worker for database \"%s\" reached idempotency.cleanup_max_batches: %lld expired records %s in %d batches, the rest waits for the next cycle",
								worker_dbname, (long long) pass_rows,
								pass == IDEM_PASS_PURGE ? "purged" : "deleted",
								batches),
						 errhint("Raise idempotency.cleanup_max_batches or lower idempotency.naptime if the backlog keeps growing.")));
			break;
		}

		/* a latch set by SIGHUP or SIGTERM cuts the pause short */
		if (pass != IDEM_PASS_LEASES && idem_cleanup_delay_ms > 0)
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
		if (!idem_status_note_waiting(true))
			ereport(LOG,
					(errmsg("idempotency worker for database \"%s\" is waiting for extension \"%s\" to be installed",
							worker_dbname, IDEM_EXTENSION_NAME),
					 errhint("Run CREATE EXTENSION %s in database \"%s\".",
							 IDEM_EXTENSION_NAME, worker_dbname)));
	}
	else
	{
		if (idem_status_note_waiting(false))
			ereport(LOG,
					(errmsg("idempotency worker for database \"%s\" found extension \"%s\" and starts its maintenance",
							worker_dbname, IDEM_EXTENSION_NAME)));

		idem_maintenance_prepare(extoid);

		/*
		 * A deferred constraint (a foreign key of the user's referencing a
		 * record, say) would otherwise fail at commit, where no row can be
		 * told from the others and the same batch would fail every cycle:
		 * checked at the end of each statement, it fails inside the
		 * subtransaction of the row, which is then skipped.
		 */
		if (SPI_execute("SET CONSTRAINTS ALL IMMEDIATE", false, 0) != SPI_OK_UTILITY)
			elog(ERROR, "SET CONSTRAINTS failed");
		pgstat_report_activity(STATE_RUNNING,
							   run->pass == IDEM_PASS_LEASES
							   ? "idempotency: expiring leases"
							   : run->pass == IDEM_PASS_PURGE
							   ? "idempotency: purging expired responses"
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
					   pass == IDEM_PASS_LEASES ? "lease expiry" :
					   pass == IDEM_PASS_PURGE ? "purge" : "cleanup")));
}

/*
 * idem_launch_worker() returns integer
 *
 * Start a launcher for the current database without a restart, and return
 * its pid.  Refuses when a process already serves this database.
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

	if (!start_process("idem_launcher_main", MyDatabaseId, dbname,
					   IDEM_LAUNCHER_NAME, &handle))
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
	 * Wait until the launcher has claimed the database, or has given way to
	 * one that a concurrent call or the static launcher started meanwhile.
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

/*
 * Define the worker's settings that can change after start-up: how long
 * it sleeps between cycles, and between two cleanup transactions.  Called
 * from _PG_init on every load.
 */
void
idem_worker_init(void)
{
	DefineCustomIntVariable("idempotency.naptime",
							"Time the background worker sleeps between cycles.",
							NULL,
							&idem_naptime_ms,
							10 * 1000, 10, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.cleanup_delay",
							"Time the background worker sleeps between two cleanup transactions of a cycle.",
							"Spreads the deletion of a large backlog, leaving the processors to the claims meanwhile.",
							&idem_cleanup_delay_ms,
							50, 0, 10 * 1000,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/*
 * Define idempotency.database, the databases the launcher serves: a
 * PGC_POSTMASTER setting, so only while shared_preload_libraries is
 * processed.
 */
void
idem_worker_define_postmaster_settings(void)
{
	DefineCustomStringVariable("idempotency.database",
							   "Comma-separated list of databases the background worker serves.",
							   "Takes effect at server start; use idem_launch_worker() for another database without a restart.",
							   &idem_worker_databases,
							   "postgres",
							   PGC_POSTMASTER, 0,
							   NULL, NULL, NULL);
}
