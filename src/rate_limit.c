/*-------------------------------------------------------------------------
 *
 * rate_limit.c
 *	  idempotency.max_new_keys_per_second: how many records each role may
 *	  create per second in each database, so that no caller fills the table
 *	  with unique keys.
 *
 * A token bucket per (database, role) in shared memory.  A bucket holds at
 * most one second of the rate (the burst) and refills continuously at the
 * rate; a claim that would create a record (claim.c, once it owns the key)
 * takes one token, or is answered rate_limited when there is none, with
 * retry_after the seconds until one is there, rounded up.  A claim whose
 * write then finds the record changed gives its token back.  Nothing is
 * written to any table.  A bucket is created full the first time a role
 * creates a record in a database; a reload that changes the rate applies
 * to every bucket at its next use (tokens above the new burst are dropped).
 *
 * The buckets live in a hash table of IDEM_RATE_BUCKETS entries.  A bucket
 * that has refilled completely says nothing a new bucket would not, so
 * when the table is full the buckets of every role idle for a second or
 * more are dropped to make room.  If none is (more than IDEM_RATE_BUCKETS
 * roles and databases created records within the last second), a claim of
 * a role that has no bucket is answered rate_limited with retry_after 1:
 * the limit is never exceeded, and room is made within a second.
 *
 * The area is requested through shmem_request_hook, so the limit needs the
 * library in shared_preload_libraries.  Without it the setting is ignored,
 * and each session that meets a claim it would limit says so once in a
 * WARNING.
 *
 * Locking, as in contrib/pg_stat_statements: one LWLock over the hash
 * table, held shared to find a bucket and exclusive to add or drop one,
 * and a spinlock per bucket over its tokens.  Neither is held across
 * anything that can raise an error.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"

#include "rate_limit.h"

#define IDEM_RATE_BUCKETS		1024
#define IDEM_RATE_TRANCHE		"idempotency rate limit"

/* A bucket's hash key. */
typedef struct RateBucketKey
{
	Oid			dboid;
	Oid			roleid;
} RateBucketKey;

/* The tokens of one role in one database. */
typedef struct RateBucket
{
	RateBucketKey key;			/* must be first */
	slock_t		mutex;			/* protects the fields below */
	double		tokens;			/* tokens at refilled_at */
	TimestampTz refilled_at;
} RateBucket;

/* The shared state besides the hash table. */
typedef struct RateLimitShared
{
	LWLock	   *lock;			/* protects the hash table's entries */
} RateLimitShared;

int			idem_max_new_keys_per_second = 0;

static RateLimitShared *rate_shared = NULL;
static HTAB *rate_hash = NULL;

/* Whether this session has said that the setting is ignored. */
static bool warned_not_preloaded = false;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void rate_shmem_request(void);
static void rate_shmem_startup(void);
static void refill(RateBucket *bucket, int rate, TimestampTz now);
static RateBucket *add_bucket(const RateBucketKey *key, int rate,
							  TimestampTz now);
static void drop_refilled_buckets(int rate, TimestampTz now);

/*
 * Install the shared-memory hooks.  Called from _PG_init while
 * shared_preload_libraries is processed.
 */
void
idem_rate_limit_install_hooks(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = rate_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = rate_shmem_startup;
}

/*
 * shmem_request_hook: reserve the space and the lock.
 */
static void
rate_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();

	RequestAddinShmemSpace(add_size(MAXALIGN(sizeof(RateLimitShared)),
									hash_estimate_size(IDEM_RATE_BUCKETS,
													   sizeof(RateBucket))));
	RequestNamedLWLockTranche(IDEM_RATE_TRANCHE, 1);
}

/*
 * shmem_startup_hook: create or attach to the area.  Runs in the postmaster
 * at start and after every crash, when shared memory is rebuilt: the
 * buckets start full again.
 */
static void
rate_shmem_startup(void)
{
	HASHCTL		info;
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	rate_shared = NULL;
	rate_hash = NULL;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	rate_shared = ShmemInitStruct("idempotency rate limit",
								  sizeof(RateLimitShared), &found);
	if (!found)
		rate_shared->lock = &(GetNamedLWLockTranche(IDEM_RATE_TRANCHE))->lock;

	info.keysize = sizeof(RateBucketKey);
	info.entrysize = sizeof(RateBucket);
	rate_hash = ShmemInitHash("idempotency rate limit buckets",
							  IDEM_RATE_BUCKETS, IDEM_RATE_BUCKETS,
							  &info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	LWLockRelease(AddinShmemInitLock);
}

/*
 * Take a token from the bucket of a role in a database, at the rate
 * idempotency.max_new_keys_per_second says now.  Returns false, with the
 * whole seconds until a token is there in *retry_after (at least 1), when
 * there is none.  Always true when the limit is off, or ignored because
 * the library is not preloaded.
 */
bool
idem_rate_limit_take(Oid dboid, Oid roleid, int32 *retry_after)
{
	int			rate = idem_max_new_keys_per_second;
	TimestampTz now;
	RateBucketKey key;
	RateBucket *bucket;
	double		missing = 0.0;
	bool		taken;

	if (rate <= 0)
		return true;
	if (rate_hash == NULL)
	{
		if (!warned_not_preloaded)
		{
			warned_not_preloaded = true;
			ereport(WARNING,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("idempotency.max_new_keys_per_second is ignored because the library is not in shared_preload_libraries"),
					 errdetail("The token buckets of the limit live in shared memory reserved at server start."),
					 errhint("Add idempotency to shared_preload_libraries and restart the server.")));
		}
		return true;
	}

	memset(&key, 0, sizeof(key));
	key.dboid = dboid;
	key.roleid = roleid;

	now = GetCurrentTimestamp();
	LWLockAcquire(rate_shared->lock, LW_SHARED);
	bucket = hash_search(rate_hash, &key, HASH_FIND, NULL);
	if (bucket == NULL)
	{
		LWLockRelease(rate_shared->lock);
		LWLockAcquire(rate_shared->lock, LW_EXCLUSIVE);
		bucket = add_bucket(&key, rate, now);
		if (bucket == NULL)
		{
			/* every bucket was used within the last second */
			LWLockRelease(rate_shared->lock);
			*retry_after = 1;
			return false;
		}
	}

	SpinLockAcquire(&bucket->mutex);
	refill(bucket, rate, now);
	taken = bucket->tokens >= 1.0;
	if (taken)
		bucket->tokens -= 1.0;
	else
		missing = 1.0 - bucket->tokens;
	SpinLockRelease(&bucket->mutex);
	LWLockRelease(rate_shared->lock);

	if (!taken)
	{
		/* seconds until the missing part of a token has refilled */
		double		seconds = ceil(missing / rate);

		*retry_after = (int32) Max(1.0, Min(seconds, (double) PG_INT32_MAX));
	}
	return taken;
}

/*
 * Give back the token a claim took for a record it did not create after
 * all (another claim changed the record first).
 */
void
idem_rate_limit_give_back(Oid dboid, Oid roleid)
{
	int			rate = idem_max_new_keys_per_second;
	RateBucketKey key;
	RateBucket *bucket;

	if (rate <= 0 || rate_hash == NULL)
		return;

	memset(&key, 0, sizeof(key));
	key.dboid = dboid;
	key.roleid = roleid;

	LWLockAcquire(rate_shared->lock, LW_SHARED);
	bucket = hash_search(rate_hash, &key, HASH_FIND, NULL);
	if (bucket != NULL)
	{
		SpinLockAcquire(&bucket->mutex);
		bucket->tokens = Min(bucket->tokens + 1.0, (double) rate);
		SpinLockRelease(&bucket->mutex);
	}
	LWLockRelease(rate_shared->lock);
}

/*
 * Bring a bucket's tokens up to now at the rate, never above the burst
 * (one second of the rate).  A now slightly behind refilled_at (another
 * process read the clock later but got here first) refills nothing: moving
 * refilled_at back would count that time twice.  A clock set back by more
 * than a second restarts from now.  The caller holds the bucket's spinlock,
 * or the hash table's lock exclusively.
 */
static void
refill(RateBucket *bucket, int rate, TimestampTz now)
{
	if (now > bucket->refilled_at)
	{
		bucket->tokens += (double) (now - bucket->refilled_at) * rate / USECS_PER_SEC;
		bucket->refilled_at = now;
	}
	else if (bucket->refilled_at - now > USECS_PER_SEC)
		bucket->refilled_at = now;
	bucket->tokens = Min(bucket->tokens, (double) rate);
}

/*
 * The bucket of key, created full if it is not there.  NULL when the table
 * is full even after dropping the buckets that have refilled.  The caller
 * holds the lock exclusively.
 */
static RateBucket *
add_bucket(const RateBucketKey *key, int rate, TimestampTz now)
{
	RateBucket *bucket;
	bool		found;

	bucket = hash_search(rate_hash, key, HASH_ENTER_NULL, &found);
	if (bucket == NULL)
	{
		drop_refilled_buckets(rate, now);
		bucket = hash_search(rate_hash, key, HASH_ENTER_NULL, &found);
		if (bucket == NULL)
			return NULL;
	}
	if (!found)
	{
		SpinLockInit(&bucket->mutex);
		bucket->tokens = rate;
		bucket->refilled_at = now;
	}
	return bucket;
}

/*
 * Drop every bucket that has refilled completely by now: a new bucket of
 * the same role would start full, so nothing is lost.  The caller holds
 * the lock exclusively, so no spinlock is held by anyone.
 */
static void
drop_refilled_buckets(int rate, TimestampTz now)
{
	HASH_SEQ_STATUS scan;
	RateBucket *bucket;

	hash_seq_init(&scan, rate_hash);
	while ((bucket = hash_seq_search(&scan)) != NULL)
	{
		refill(bucket, rate, now);
		if (bucket->tokens >= rate)
			hash_search(rate_hash, &bucket->key, HASH_REMOVE, NULL);
	}
}

/*
 * Define idempotency.max_new_keys_per_second.  Called from _PG_init on
 * every load.
 */
void
idem_rate_limit_init(void)
{
	DefineCustomIntVariable("idempotency.max_new_keys_per_second",
							"Records each role may create per second in each database.",
							"A claim that would create a record beyond it answers rate_limited "
							"and writes nothing.  0 turns the limit off.  Needs the library in "
							"shared_preload_libraries.",
							&idem_max_new_keys_per_second,
							0, 0, 1000000,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);
}
