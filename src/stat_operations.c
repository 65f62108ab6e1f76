/*-------------------------------------------------------------------------
 *
 * stat_operations.c
 *	  Counters of what happened, per (database, role, operation), kept in
 *	  shared memory, and the SQL functions behind the views
 *	  idem_stat_operations and idem_stat_operations_info and
 *	  idem_stat_reset().
 *
 * Built as contrib/pg_stat_statements is: a hash table in shared memory of
 * at most idempotency.stat_max entries (a postmaster setting), requested
 * through shmem_request_hook when the library is in shared_preload_libraries
 * and created by shmem_startup_hook.  Without the preload there is no table:
 * nothing is counted and the view shows no rows (the area cannot be sized
 * after start-up).  The postmaster writes the entries to
 * pg_stat/idem_stat_operations.stat at a clean shutdown (with
 * idempotency.stat_save on) and reads them back, deleting the file, at the
 * next start; after a crash the counters start from zero.
 *
 * When the table is full, the least recently used entries (5% of them, at
 * least 10) are evicted to make room, and the evictions are counted
 * (idem_stat_operations_info).
 *
 * An operation is kept as the bytes its database holds, with that
 * database's encoding, as pg_stat_statements keeps its query texts.  The
 * table is shared by every database, so idem_stat_operations() shows each
 * name converted to the encoding of the database that reads it, and never
 * fails on one (operation_text): a byte that is not valid there (from a
 * SQL_ASCII database), a character it lacks, and the bytes outside ASCII of
 * an encoding it has no conversion from are shown as \xNN, in hex.
 *
 * What is counted when:
 *	 - a claim's answer (one counter per IdemOutcome) and its time, at once,
 *	   through idem_stat_count_claim(): the client was given that answer,
 *	   whatever the transaction does next.  A claim that proceeded in a
 *	   transaction that then aborted counts as proceed and nothing else.
 *	 - a stale token, at once: the call fails, so its transaction aborts.
 *	 - the writes that change a record (completions, failures, leases
 *	   expired, records purged and deleted), when the transaction that made
 *	   them commits: they are kept in a backend-local list until then, and
 *	   dropped when the transaction or the subtransaction that made them
 *	   rolls back.  A prepared transaction's writes count when it is
 *	   prepared.
 *
 * Locking, as in pg_stat_statements: the LWLock is held shared to find an
 * entry and update its counters, whose own spinlock serialises the update;
 * it is held exclusive to add, evict, reset or dump entries.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "common/hashfn.h"
#include "fmgr.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "stat_operations.h"

#define STAT_DUMP_FILE	PGSTAT_STAT_PERMANENT_DIRECTORY "/idem_stat_operations.stat"
/*
 * The dump file's first four bytes: a new value whenever what is written
 * changes (StatEntry, or the header's fields), so that a file of another
 * version is ignored.  "IDS2": the key holds its encoding.
 */
#define STAT_FILE_HEADER	0x49445332	/* "IDS2" */
#define STAT_LWLOCK_TRANCHE	"idempotency stat_operations"

/* Longest operation name kept, in bytes; longer ones are cut. */
#define STAT_OPERATION_LEN	256

/* Columns of idem_stat_operations(): dbid, userid, operation, counters, time, since */
#define STAT_COLUMNS	(3 + IDEM_STAT_NUM_COUNTERS + 2)

/*
 * What an entry is counted for.  Compared as bytes: zero-padded.  An
 * operation longer than the buffer is kept cut, with a hash of its whole
 * name (zero for the names that fit), so that two operations sharing their
 * first bytes are still counted apart.  encoding is that of the database,
 * which the operation's bytes are in: it follows from dbid, but a database
 * dropped and made again under the same OID may have another.
 */
typedef struct StatKey
{
	Oid			dbid;
	Oid			userid;
	uint32		ophash;
	int32		encoding;
	char		operation[STAT_OPERATION_LEN];
} StatKey;

/* One entry of the shared table. */
typedef struct StatEntry
{
	StatKey		key;			/* must be first */
	slock_t		mutex;			/* protects what follows */
	int64		counters[IDEM_STAT_NUM_COUNTERS];
	int64		claim_time_us;	/* total time of the claims counted */
	TimestampTz last_used;		/* for eviction */
	TimestampTz stats_since;	/* when the entry was made */
} StatEntry;

/* The shared state besides the table. */
typedef struct StatShared
{
	LWLock	   *lock;
	slock_t		mutex;			/* protects what follows */
	int64		evictions;
	TimestampTz stats_reset;
} StatShared;

/* The conversion from each encoding to the database's, once looked up. */
typedef struct ConversionCache
{
	bool		looked_up[_PG_LAST_ENCODING_];
	Oid			proc[_PG_LAST_ENCODING_];	/* InvalidOid: there is none */
} ConversionCache;

/* A write counted when its transaction commits. */
typedef struct PendingCount
{
	StatKey		key;
	IdemStatCounter counter;
	int64		n;
	int			nestlevel;		/* of the (sub)transaction that made it */
} PendingCount;

int			idem_stat_max = 5000;
bool		idem_stat_track = true;
bool		idem_stat_save = true;

static StatShared *stat_shared = NULL;
static HTAB *stat_hash = NULL;

static PendingCount *pending = NULL;
static int	npending = 0;
static int	maxpending = 0;
static bool callbacks_registered = false;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

PG_FUNCTION_INFO_V1(idem_stat_operations);
PG_FUNCTION_INFO_V1(idem_stat_operations_info);
PG_FUNCTION_INFO_V1(idem_stat_reset);

static Size stat_size(void);
static void stat_shmem_request(void);
static void stat_shmem_startup(void);
static void stat_shmem_shutdown(int code, Datum arg);
static void stat_load(void);
static bool entry_is_valid(const StatEntry *entry);
static void stat_clear(void);
static uint32 stat_key_hash(const void *key, Size keysize);
static void make_key(StatKey *key, Oid userid, const char *operation, int oplen);
static void add_to_entry(const StatKey *key, IdemStatCounter counter, int64 n,
						 int64 claim_time_us, TimestampTz now);
static StatEntry *entry_alloc(const StatKey *key, TimestampTz now);
static void entry_evict(void);
static void pending_flush(void);
static void pending_xact_callback(XactEvent event, void *arg);
static void pending_subxact_callback(SubXactEvent event,
									 SubTransactionId mySubid,
									 SubTransactionId parentSubid,
									 void *arg);
static void require_stat_area(void);
static IdemStatCounter outcome_counter(IdemOutcome outcome);
static text *operation_text(const StatKey *key, ConversionCache *cache);

/*
 * Install the shared-memory hooks.  Called from _PG_init while
 * shared_preload_libraries is processed.
 */
void
idem_stat_install_hooks(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = stat_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = stat_shmem_startup;
}

/*
 * Size of the shared state and table.
 */
static Size
stat_size(void)
{
	return add_size(MAXALIGN(sizeof(StatShared)),
					hash_estimate_size(idem_stat_max, sizeof(StatEntry)));
}

/*
 * shmem_request_hook: reserve the space and the lock.
 */
static void
stat_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();

	RequestAddinShmemSpace(stat_size());
	RequestNamedLWLockTranche(STAT_LWLOCK_TRANCHE, 1);
}

/*
 * shmem_startup_hook: create or attach to the table.  In the postmaster,
 * also read the counters a clean shutdown saved and arrange for them to be
 * saved at the next one.
 */
static void
stat_shmem_startup(void)
{
	bool		found;
	HASHCTL		info;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	stat_shared = NULL;
	stat_hash = NULL;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	stat_shared = ShmemInitStruct("idempotency stat_operations",
								  sizeof(StatShared), &found);
	if (!found)
	{
		stat_shared->lock = &(GetNamedLWLockTranche(STAT_LWLOCK_TRANCHE))->lock;
		SpinLockInit(&stat_shared->mutex);
		stat_shared->evictions = 0;
		stat_shared->stats_reset = GetCurrentTimestamp();
	}
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(StatKey);
	info.entrysize = sizeof(StatEntry);
	info.hash = stat_key_hash;
	stat_hash = ShmemInitHash("idempotency stat_operations hash",
							  idem_stat_max, idem_stat_max,
							  &info, HASH_ELEM | HASH_FUNCTION);
	LWLockRelease(AddinShmemInitLock);

	if (!IsUnderPostmaster)
	{
		on_shmem_exit(stat_shmem_shutdown, (Datum) 0);
		if (!found)
			stat_load();
	}
}

/*
 * Hash of a key: the two OIDs, the hash and the encoding, and the
 * operation up to its end, not the whole zero-padded buffer.
 */
static uint32
stat_key_hash(const void *key, Size keysize pg_attribute_unused())
{
	const StatKey *k = (const StatKey *) key;

	return hash_combine(hash_bytes((const unsigned char *) k,
								   offsetof(StatKey, operation)),
						hash_bytes((const unsigned char *) k->operation,
								   strlen(k->operation)));
}

/*
 * The key of the current database, a role and an operation (oplen bytes of
 * the database's encoding, cut at a character boundary to fit, with the
 * hash of the whole name).
 */
static void
make_key(StatKey *key, Oid userid, const char *operation, int oplen)
{
	memset(key, 0, sizeof(StatKey));
	key->dbid = MyDatabaseId;
	key->userid = userid;
	key->encoding = GetDatabaseEncoding();
	if (oplen >= STAT_OPERATION_LEN)
	{
		/* never zero, the hash of the names that fit */
		key->ophash = hash_bytes((const unsigned char *) operation, oplen) | 1;
		oplen = pg_mbcliplen(operation, oplen, STAT_OPERATION_LEN - 1);
	}
	memcpy(key->operation, operation, oplen);
}

/*
 * Whether counting is on.
 */
bool
idem_stat_enabled(void)
{
	return stat_hash != NULL && idem_stat_track;
}

/*
 * The counter of a claim outcome.  A new IdemOutcome needs one case here
 * (and its column: IdemStatCounter, idem_stat_operations() in SQL); the
 * switch has no default, so that the compiler names an outcome left out.
 */
static IdemStatCounter
outcome_counter(IdemOutcome outcome)
{
	switch (outcome)
	{
		case IDEM_OUTCOME_PROCEED:
			return IDEM_STAT_PROCEED;
		case IDEM_OUTCOME_REPLAY:
			return IDEM_STAT_REPLAY;
		case IDEM_OUTCOME_IN_PROGRESS:
			return IDEM_STAT_IN_PROGRESS;
		case IDEM_OUTCOME_MISMATCH:
			return IDEM_STAT_MISMATCH;
		case IDEM_OUTCOME_UNKNOWN:
			return IDEM_STAT_UNKNOWN;
		case IDEM_OUTCOME_EXPIRED:
			return IDEM_STAT_EXPIRED;
		case IDEM_OUTCOME_RATE_LIMITED:
			return IDEM_STAT_RATE_LIMITED;
	}
	return IDEM_STAT_NONE;
}

/*
 * Count a claim's answer and the time it took.  The one entry point of
 * idem_claim (and of every other function that answers claims).
 */
void
idem_stat_count_claim(Oid userid, text *operation, IdemOutcome outcome,
					  int64 elapsed_usecs)
{
	StatKey		key;
	IdemStatCounter counter;

	if (!idem_stat_enabled())
		return;
	counter = outcome_counter(outcome);
	Assert(counter != IDEM_STAT_NONE);
	if (counter == IDEM_STAT_NONE)
		return;
	make_key(&key, userid, VARDATA_ANY(operation), VARSIZE_ANY_EXHDR(operation));
	add_to_entry(&key, counter, 1, Max(elapsed_usecs, 0),
				 GetCurrentStatementStartTimestamp());
}

/*
 * Count something that happened whether or not the transaction commits.
 * operation may be NULL: counted under the empty operation.
 */
void
idem_stat_count_now(Oid userid, text *operation, IdemStatCounter counter,
					int64 n)
{
	StatKey		key;

	if (!idem_stat_enabled())
		return;
	if (operation != NULL)
		make_key(&key, userid, VARDATA_ANY(operation), VARSIZE_ANY_EXHDR(operation));
	else
		make_key(&key, userid, "", 0);
	add_to_entry(&key, counter, n, 0, GetCurrentStatementStartTimestamp());
}

/*
 * Add to the counters of an entry, making it if needed.  Never raises an
 * error (it runs at commit): when no entry can be made, nothing is counted.
 */
static void
add_to_entry(const StatKey *key, IdemStatCounter counter, int64 n,
			 int64 claim_time_us, TimestampTz now)
{
	StatEntry  *entry;

	LWLockAcquire(stat_shared->lock, LW_SHARED);
	entry = (StatEntry *) hash_search(stat_hash, key, HASH_FIND, NULL);
	if (entry == NULL)
	{
		LWLockRelease(stat_shared->lock);
		LWLockAcquire(stat_shared->lock, LW_EXCLUSIVE);
		entry = entry_alloc(key, now);
		if (entry == NULL)
		{
			LWLockRelease(stat_shared->lock);
			return;
		}
	}

	SpinLockAcquire(&entry->mutex);
	entry->counters[counter] += n;
	entry->claim_time_us += claim_time_us;
	if (now > entry->last_used)
		entry->last_used = now;
	SpinLockRelease(&entry->mutex);

	LWLockRelease(stat_shared->lock);
}

/*
 * Find or make the entry of a key, evicting the least recently used ones
 * when the table is full.  The caller holds the lock exclusive.
 */
static StatEntry *
entry_alloc(const StatKey *key, TimestampTz now)
{
	StatEntry  *entry;
	bool		found;

	if (hash_get_num_entries(stat_hash) >= idem_stat_max)
		entry_evict();

	entry = (StatEntry *) hash_search(stat_hash, key, HASH_ENTER_NULL, &found);
	if (entry != NULL && !found)
	{
		SpinLockInit(&entry->mutex);
		memset(entry->counters, 0, sizeof(entry->counters));
		entry->claim_time_us = 0;
		entry->last_used = now;
		entry->stats_since = GetCurrentTimestamp();
	}
	return entry;
}

/* qsort comparator: least recently used first */
static int
entry_cmp(const void *a, const void *b)
{
	TimestampTz ta = (*(StatEntry *const *) a)->last_used;
	TimestampTz tb = (*(StatEntry *const *) b)->last_used;

	return ta < tb ? -1 : ta > tb ? 1 : 0;
}

/*
 * Evict the least recently used 5% of the entries, at least 10.  The caller
 * holds the lock exclusive.  It may run at commit, so it never raises: when
 * memory for the sort is short, it evicts nothing and the count is lost.
 */
static void
entry_evict(void)
{
	HASH_SEQ_STATUS hash_seq;
	StatEntry **entries;
	StatEntry  *entry;
	int			n = 0;
	int			nvictims;
	int			i;

	entries = MemoryContextAllocExtended(TopMemoryContext,
										 hash_get_num_entries(stat_hash) * sizeof(StatEntry *),
										 MCXT_ALLOC_NO_OOM);
	if (entries == NULL)
		return;
	hash_seq_init(&hash_seq, stat_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
		entries[n++] = entry;
	qsort(entries, n, sizeof(StatEntry *), entry_cmp);
	nvictims = Min(n, Max(10, n * 5 / 100));
	for (i = 0; i < nvictims; i++)
		hash_search(stat_hash, &entries[i]->key, HASH_REMOVE, NULL);
	pfree(entries);

	SpinLockAcquire(&stat_shared->mutex);
	stat_shared->evictions += nvictims;
	SpinLockRelease(&stat_shared->mutex);
}

/*
 * Count a write when the current transaction commits.
 */
void
idem_stat_count_at_commit(Oid userid, const char *operation, int oplen,
						  IdemStatCounter counter, int64 n)
{
	PendingCount *p;
	StatKey		key;
	int			nestlevel = GetCurrentTransactionNestLevel();

	if (!idem_stat_enabled() || n == 0)
		return;
	if (!callbacks_registered)
	{
		RegisterXactCallback(pending_xact_callback, NULL);
		RegisterSubXactCallback(pending_subxact_callback, NULL);
		callbacks_registered = true;
	}
	make_key(&key, userid, operation, oplen);

	/* the same count as the last one (a batch of completions): add to it */
	if (npending > 0)
	{
		p = &pending[npending - 1];
		if (p->counter == counter && p->nestlevel == nestlevel &&
			memcmp(&p->key, &key, sizeof(StatKey)) == 0)
		{
			p->n += n;
			return;
		}
	}
	if (npending >= maxpending)
	{
		int			newmax = Max(16, maxpending * 2);

		pending = pending == NULL ?
			MemoryContextAlloc(TopMemoryContext, newmax * sizeof(PendingCount)) :
			repalloc(pending, newmax * sizeof(PendingCount));
		maxpending = newmax;
	}
	p = &pending[npending++];
	p->key = key;
	p->counter = counter;
	p->n = n;
	p->nestlevel = nestlevel;
}

/*
 * Add the pending counts to the table and forget them.
 */
static void
pending_flush(void)
{
	TimestampTz now;
	int			i;

	if (npending == 0)
		return;
	now = GetCurrentTimestamp();
	for (i = 0; i < npending; i++)
	{
		if (stat_hash != NULL)
			add_to_entry(&pending[i].key, pending[i].counter, pending[i].n,
						 0, now);
	}
	npending = 0;
}

/*
 * Transaction end: count the pending writes on commit (and prepare),
 * forget them on abort.
 */
static void
pending_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PREPARE:
			pending_flush();
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			npending = 0;
			break;
		default:
			break;
	}
}

/*
 * Subtransaction end: its pending writes pass to the parent on commit and
 * are forgotten on abort.
 */
static void
pending_subxact_callback(SubXactEvent event,
						 SubTransactionId mySubid pg_attribute_unused(),
						 SubTransactionId parentSubid pg_attribute_unused(),
						 void *arg pg_attribute_unused())
{
	int			level = GetCurrentTransactionNestLevel();
	int			i;
	int			kept = 0;

	if (event == SUBXACT_EVENT_COMMIT_SUB)
	{
		for (i = 0; i < npending; i++)
			if (pending[i].nestlevel >= level)
				pending[i].nestlevel = level - 1;
	}
	else if (event == SUBXACT_EVENT_ABORT_SUB)
	{
		for (i = 0; i < npending; i++)
			if (pending[i].nestlevel < level)
				pending[kept++] = pending[i];
		npending = kept;
	}
}

/*
 * on_shmem_exit callback of the postmaster: write the entries to disk at a
 * clean shutdown.  As in pg_stat_statements, nothing is written after a
 * crash (code != 0).
 */
static void
stat_shmem_shutdown(int code, Datum arg pg_attribute_unused())
{
	FILE	   *file;
	HASH_SEQ_STATUS hash_seq;
	StatEntry  *entry;
	int32		n;
	uint32		header = STAT_FILE_HEADER;

	if (code != 0 || stat_shared == NULL || stat_hash == NULL || !idem_stat_save)
		return;

	file = AllocateFile(STAT_DUMP_FILE ".tmp", PG_BINARY_W);
	if (file == NULL)
		goto error;
	n = (int32) hash_get_num_entries(stat_hash);
	if (fwrite(&header, sizeof(header), 1, file) != 1 ||
		fwrite(&n, sizeof(n), 1, file) != 1 ||
		fwrite(&stat_shared->evictions, sizeof(int64), 1, file) != 1 ||
		fwrite(&stat_shared->stats_reset, sizeof(TimestampTz), 1, file) != 1)
		goto error;
	hash_seq_init(&hash_seq, stat_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
	{
		if (fwrite(entry, sizeof(StatEntry), 1, file) != 1)
		{
			hash_seq_term(&hash_seq);
			goto error;
		}
	}
	if (FreeFile(file))
	{
		file = NULL;
		goto error;
	}
	(void) durable_rename(STAT_DUMP_FILE ".tmp", STAT_DUMP_FILE, LOG);
	return;

error:
	ereport(LOG,
			(errcode_for_file_access(),
			 errmsg("could not write file \"%s\": %m", STAT_DUMP_FILE ".tmp")));
	if (file)
		FreeFile(file);
	unlink(STAT_DUMP_FILE ".tmp");
}

/*
 * Whether an entry read from the file is one this build could have written:
 * its encoding is a server encoding, its operation ends with a zero inside
 * its buffer and the rest of the buffer is zero (keys are compared as bytes
 * and hashed up to the zero).
 */
static bool
entry_is_valid(const StatEntry *entry)
{
	const char *op = entry->key.operation;
	const char *end = memchr(op, '\0', STAT_OPERATION_LEN);

	if (!PG_VALID_BE_ENCODING(entry->key.encoding) || end == NULL)
		return false;
	while (++end < op + STAT_OPERATION_LEN)
		if (*end != '\0')
			return false;
	return true;
}

/*
 * Forget every entry and the evictions: the table as at a first start.
 * The caller holds the lock exclusive, or is the postmaster at start.
 */
static void
stat_clear(void)
{
	HASH_SEQ_STATUS hash_seq;
	StatEntry  *entry;

	hash_seq_init(&hash_seq, stat_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
		hash_search(stat_hash, &entry->key, HASH_REMOVE, NULL);
	SpinLockAcquire(&stat_shared->mutex);
	stat_shared->evictions = 0;
	stat_shared->stats_reset = GetCurrentTimestamp();
	SpinLockRelease(&stat_shared->mutex);
}

/*
 * Read the entries a clean shutdown saved, then delete the file, so that a
 * crash later does not bring back old counters.  Runs in the postmaster at
 * start, with the table empty.  A file that cannot be read, or is not whole
 * and of this build's format (its length is not that of its header and
 * entries, an entry's operation is not a zero-padded name), is logged and
 * ignored: none of its entries is kept.
 */
static void
stat_load(void)
{
	FILE	   *file;
	struct stat st;
	uint32		header;
	int32		n;
	int32		i;
	int64		evictions;
	TimestampTz stats_reset;
	const off_t header_len = sizeof(header) + sizeof(n) + sizeof(evictions) +
		sizeof(stats_reset);

	file = AllocateFile(STAT_DUMP_FILE, PG_BINARY_R);
	if (file == NULL)
	{
		if (errno != ENOENT)
			ereport(LOG,
					(errcode_for_file_access(),
					 errmsg("could not read file \"%s\": %m", STAT_DUMP_FILE)));
		return;
	}
	if (fstat(fileno(file), &st) != 0 ||
		fread(&header, sizeof(header), 1, file) != 1 ||
		header != STAT_FILE_HEADER ||
		fread(&n, sizeof(n), 1, file) != 1 ||
		n < 0 ||
		st.st_size != header_len + (off_t) n * (off_t) sizeof(StatEntry) ||
		fread(&evictions, sizeof(evictions), 1, file) != 1 ||
		fread(&stats_reset, sizeof(stats_reset), 1, file) != 1)
		goto error;
	stat_shared->evictions = evictions;
	stat_shared->stats_reset = stats_reset;
	for (i = 0; i < n; i++)
	{
		StatEntry	temp;
		StatEntry  *entry;

		if (fread(&temp, sizeof(StatEntry), 1, file) != 1 ||
			!entry_is_valid(&temp))
			goto error;
		/* a smaller idempotency.stat_max keeps the most recently used */
		entry = entry_alloc(&temp.key, temp.last_used);
		if (entry == NULL)
			break;
		memcpy(entry->counters, temp.counters, sizeof(temp.counters));
		entry->claim_time_us = temp.claim_time_us;
		entry->last_used = temp.last_used;
		entry->stats_since = temp.stats_since;
	}
	FreeFile(file);
	unlink(STAT_DUMP_FILE);
	return;

error:
	ereport(LOG,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("ignoring invalid file \"%s\"", STAT_DUMP_FILE)));
	stat_clear();
	FreeFile(file);
	unlink(STAT_DUMP_FILE);
}

/*
 * Raise a clear error when the shared table does not exist.
 */
static void
require_stat_area(void)
{
	if (stat_hash == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency counters are not kept"),
				 errdetail("They live in shared memory set up at server start."),
				 errhint("Add idempotency to shared_preload_libraries and restart the server.")));
}

/*
 * Append bytes as \xNN each.
 */
static void
append_escaped(StringInfo buf, const char *s, int len)
{
	int			i;

	for (i = 0; i < len; i++)
		appendStringInfo(buf, "\\x%02x", (unsigned char) s[i]);
}

/*
 * Append bytes that need no conversion, each byte that does not begin a
 * valid character of the current database's encoding escaped.
 */
static void
append_verified(StringInfo buf, const char *s, int len)
{
	int			encoding = GetDatabaseEncoding();

	while (len > 0)
	{
		int			valid = pg_encoding_verifymbstr(encoding, s, len);

		appendBinaryStringInfo(buf, s, valid);
		s += valid;
		len -= valid;
		if (len > 0)
		{
			append_escaped(buf, s, 1);
			s++;
			len--;
		}
	}
}

/*
 * Append bytes of another encoding converted by a conversion function:
 * each character it cannot convert (or byte that is not a character of the
 * source encoding) escaped.  len is less than STAT_OPERATION_LEN, so that
 * the conversion is never cut short for lack of room.
 */
static void
append_converted(StringInfo buf, const char *s, int len, int encoding,
				 Oid conversion)
{
	unsigned char out[STAT_OPERATION_LEN * MAX_CONVERSION_GROWTH + 1];

	Assert(len < STAT_OPERATION_LEN);
	while (len > 0)
	{
		unsigned char *in = (unsigned char *) unconstify(char *, s);
		int			done;

		done = pg_do_encoding_conversion_buf(conversion, encoding,
											 GetDatabaseEncoding(), in, len,
											 out, sizeof(out), true);
		appendStringInfoString(buf, (const char *) out);
		s += done;
		len -= done;
		if (len > 0)
		{
			int			charlen = pg_encoding_verifymbchar(encoding, s, len);

			if (charlen < 1)
				charlen = 1;
			append_escaped(buf, s, charlen);
			s += charlen;
			len -= charlen;
		}
	}
}

/*
 * The operation of an entry, as text of the current database's encoding.
 * Never fails: what cannot be shown as a character is shown as \xNN.
 *	 - Of the same encoding, or when either is SQL_ASCII (whose bytes have
 *	   no known encoding), the bytes are kept as they are, those that are not
 *	   valid here escaped: PostgreSQL's own rule for SQL_ASCII
 *	   (pg_do_encoding_conversion).
 *	 - Else they are converted by the default conversion between the two
 *	   encodings, the characters that this encoding lacks escaped.  Without
 *	   such a conversion, every byte outside ASCII (which all server
 *	   encodings share) is escaped.
 * cache holds the conversion functions looked up by one call of
 * idem_stat_operations().
 */
static text *
operation_text(const StatKey *key, ConversionCache *cache)
{
	const char *s = key->operation;
	int			len = strlen(s);
	int			encoding = key->encoding;
	int			here = GetDatabaseEncoding();
	StringInfoData buf;
	text	   *result;
	int			i;

	initStringInfo(&buf);
	if (encoding == here || encoding == PG_SQL_ASCII || here == PG_SQL_ASCII)
		append_verified(&buf, s, len);
	else
	{
		Oid			conversion = InvalidOid;

		if (PG_VALID_BE_ENCODING(encoding))
		{
			if (!cache->looked_up[encoding])
			{
				cache->proc[encoding] =
					FindDefaultConversionProc(encoding, here);
				cache->looked_up[encoding] = true;
			}
			conversion = cache->proc[encoding];
		}
		if (OidIsValid(conversion))
			append_converted(&buf, s, len, encoding, conversion);
		else
		{
			for (i = 0; i < len; i++)
			{
				if (IS_HIGHBIT_SET(s[i]))
					append_escaped(&buf, s + i, 1);
				else
					appendStringInfoChar(&buf, s[i]);
			}
		}
	}
	result = cstring_to_text_with_len(buf.data, buf.len);
	pfree(buf.data);
	return result;
}

/*
 * idem_stat_operations() returns setof record: the counters of every
 * (database, role, operation) the calling role may see: its own, or all of
 * them with the privileges of pg_read_all_stats.  No rows without the
 * preload.  The entries are copied under the lock, and their names
 * converted (which may read the catalog) once it is released.
 */
Datum
idem_stat_operations(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			userid = GetUserId();
	bool		see_all;
	HASH_SEQ_STATUS hash_seq;
	StatEntry  *entry;
	StatEntry  *rows;
	long		nrows = 0;
	long		r;
	ConversionCache cache;

	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != STAT_COLUMNS)
		elog(ERROR, "idem_stat_operations has %d columns, expected %d",
			 rsinfo->setDesc->natts, STAT_COLUMNS);
	if (stat_hash == NULL)
		return (Datum) 0;
	see_all = has_privs_of_role(userid, ROLE_PG_READ_ALL_STATS);

	LWLockAcquire(stat_shared->lock, LW_SHARED);
	/* entries are added under the lock exclusive only: the count holds */
	rows = MemoryContextAllocHuge(CurrentMemoryContext,
								  Max(hash_get_num_entries(stat_hash), 1) *
								  sizeof(StatEntry));
	hash_seq_init(&hash_seq, stat_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
	{
		StatEntry  *row;

		if (!see_all && entry->key.userid != userid)
			continue;
		row = &rows[nrows++];
		row->key = entry->key;
		SpinLockAcquire(&entry->mutex);
		memcpy(row->counters, entry->counters, sizeof(row->counters));
		row->claim_time_us = entry->claim_time_us;
		SpinLockRelease(&entry->mutex);
		row->stats_since = entry->stats_since;
	}
	LWLockRelease(stat_shared->lock);

	memset(&cache, 0, sizeof(cache));
	for (r = 0; r < nrows; r++)
	{
		StatEntry  *row = &rows[r];
		Datum		values[STAT_COLUMNS];
		bool		nulls[STAT_COLUMNS];
		int			col = 0;
		int			i;

		memset(nulls, false, sizeof(nulls));
		values[col++] = ObjectIdGetDatum(row->key.dbid);
		values[col++] = ObjectIdGetDatum(row->key.userid);
		values[col++] = PointerGetDatum(operation_text(&row->key, &cache));
		for (i = 0; i < IDEM_STAT_NUM_COUNTERS; i++)
			values[col++] = Int64GetDatum(row->counters[i]);
		values[col++] = Float8GetDatum((double) row->claim_time_us / 1000.0);
		values[col++] = TimestampTzGetDatum(row->stats_since);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		pfree(DatumGetPointer(values[2]));
	}
	pfree(rows);
	return (Datum) 0;
}

/*
 * idem_stat_operations_info() returns (evictions bigint, stats_reset
 * timestamptz); no row without the preload.
 */
Datum
idem_stat_operations_info(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum		values[2];
	bool		nulls[2] = {false, false};

	InitMaterializedSRF(fcinfo, 0);
	if (stat_shared == NULL)
		return (Datum) 0;
	SpinLockAcquire(&stat_shared->mutex);
	values[0] = Int64GetDatum(stat_shared->evictions);
	values[1] = TimestampTzGetDatum(stat_shared->stats_reset);
	SpinLockRelease(&stat_shared->mutex);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	return (Datum) 0;
}

/*
 * idem_stat_reset(): forget every counter and the evictions.  EXECUTE is
 * revoked from PUBLIC: superusers, and roles granted it.
 */
Datum
idem_stat_reset(PG_FUNCTION_ARGS)
{
	(void) fcinfo;
	require_stat_area();
	LWLockAcquire(stat_shared->lock, LW_EXCLUSIVE);
	stat_clear();
	LWLockRelease(stat_shared->lock);
	PG_RETURN_VOID();
}

/*
 * Define the settings of the counters that can change after start-up.
 * Called from _PG_init on every load.
 */
void
idem_stat_init(void)
{
	DefineCustomBoolVariable("idempotency.track_operations",
							 "Counts claim outcomes, completions and maintenance work in idem_stat_operations.",
							 "Needs the library in shared_preload_libraries.",
							 &idem_stat_track,
							 true,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);

	DefineCustomBoolVariable("idempotency.stat_save",
							 "Keeps the counters of idem_stat_operations across a clean server restart.",
							 NULL,
							 &idem_stat_save,
							 true,
							 PGC_SIGHUP, 0,
							 NULL, NULL, NULL);
}

/*
 * Define idempotency.stat_max, which sizes the shared area: a
 * PGC_POSTMASTER setting, so only while shared_preload_libraries is
 * processed.
 */
void
idem_stat_define_postmaster_settings(void)
{
	DefineCustomIntVariable("idempotency.stat_max",
							"Most (database, role, operation) entries idem_stat_operations keeps.",
							"The least recently used are evicted to make room for new ones.",
							&idem_stat_max,
							5000, 100, INT_MAX / 2,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);
}
