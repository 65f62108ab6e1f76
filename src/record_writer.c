/*-------------------------------------------------------------------------
 *
 * record_writer.c
 *	  Executor-free inserts and updates of idem_records, the way logical
 *	  replication applies a change: a ResultRelInfo and its indexes, and
 *	  ExecSimpleRelationInsert / ExecSimpleRelationUpdate, which fire the
 *	  table's row triggers (the state machine among them), check its
 *	  constraints and maintain every index.
 *
 * A statement would plan nothing here that is not known in advance, yet
 * running one costs an executor start-up and shutdown, and PostgreSQL
 * compiles the table's CHECK constraints and partial index predicates anew
 * for every statement.  A claim and its completion write one row each, so
 * those costs were most of what a new key cost beyond the storage itself.
 * This file keeps the compiled constraints and predicates for the life of
 * the backend instead, and drops them when the table's relcache entry is
 * invalidated (any ALTER TABLE, CREATE or DROP INDEX) or an evaluation was
 * interrupted by an error.  An entry dropped while a write may still be
 * using it is freed at the end of the transaction, not at once.
 *
 * A row to update is found through the primary key with a fresh snapshot
 * and locked the way UPDATE locks it: waiting (or skipping, for claims),
 * and under READ COMMITTED following the row to its newest version, which
 * the caller then checks again.  Under REPEATABLE READ or SERIALIZABLE a
 * row changed by a concurrent transaction raises the usual serialization
 * failure.
 *
 * No privilege is checked here: callers run as the owner of idem_records
 * (security.c) and have already refused writes in read-only transactions
 * and on standbys.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "nodes/makefuncs.h"
#include "optimizer/optimizer.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "catalog.h"
#include "record_writer.h"

/* What is compiled once per backend for the records table. */
typedef struct WriterCache
{
	MemoryContext context;
	Oid			relid;
	Oid			id_sequence;	/* of the identity column */
	int			ncheck;
	ExprState **checks;			/* in the order of rd_att->constr->check */
	int			npredicates;
	Oid		   *predicate_index;
	ExprState **predicate;
} WriterCache;

static WriterCache cache;
static bool cache_valid = false;
static bool cache_in_use = false;
static bool callback_registered = false;

static void use_compiled_expressions(IdemRecordWriter *w);
static void build_cache(IdemRecordWriter *w);
static void retire_cache(void);
static void invalidate_cache(Datum arg, Oid relid);
static Relation opened_index(IdemRecordWriter *w, Oid index_oid);

/*
 * Open idem_records for one write: the table, its indexes, an executor
 * state to run triggers and constraints in.  idem_writer_end closes it.
 */
void
idem_writer_begin(IdemRecordWriter *w)
{
	const IdemCatalog *cat = idem_catalog();
	MemoryContext oldcontext;

	memset(w, 0, sizeof(*w));
	w->rel = table_open(cat->table_oid, RowExclusiveLock);
	w->estate = CreateExecutorState();
	w->estate->es_output_cid = GetCurrentCommandId(true);

	oldcontext = MemoryContextSwitchTo(w->estate->es_query_cxt);
	w->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(w->rri, w->rel, 0, NULL, 0);
	/* where AFTER triggers look for the table: not opened a second time */
	w->estate->es_opened_result_relations =
		lappend(w->estate->es_opened_result_relations, w->rri);
	ExecOpenIndices(w->rri, false);
	w->old_slot = table_slot_create(w->rel, &w->estate->es_tupleTable);
	w->new_slot = ExecInitExtraTupleSlot(w->estate, RelationGetDescr(w->rel),
										 &TTSOpsVirtual);
	use_compiled_expressions(w);
	MemoryContextSwitchTo(oldcontext);

	AfterTriggerBeginQuery();
}

/*
 * Fire the AFTER triggers the write queued and close everything
 * idem_writer_begin opened.
 */
void
idem_writer_end(IdemRecordWriter *w)
{
	AfterTriggerEndQuery(w->estate);
	/* our indexes, and anything AFTER triggers opened */
	ExecCloseResultRelations(w->estate);
	ExecResetTupleTable(w->estate->es_tupleTable, false);
	FreeExecutorState(w->estate);
	if (w->snapshot != NULL)
		UnregisterSnapshot(w->snapshot);
	table_close(w->rel, NoLock);
	cache_in_use = false;
}

/*
 * Whether the unique index index_oid holds an entry matching keys that is
 * live or being written, committed or not, visible to this transaction's
 * snapshot or not: what an INSERT of those keys would conflict with.
 */
bool
idem_writer_key_taken(IdemRecordWriter *w, Oid index_oid, ScanKey keys,
					  int nkeys)
{
	SnapshotData dirty;
	IndexScanDesc scan;
	bool		found;

	InitDirtySnapshot(dirty);
	scan = index_beginscan(w->rel, opened_index(w, index_oid), &dirty, nkeys, 0);
	index_rescan(scan, keys, nkeys, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, w->old_slot);
	index_endscan(scan);
	ExecClearTuple(w->old_slot);
	return found;
}

/*
 * The next value of the table's identity column.
 */
int64
idem_writer_next_id(IdemRecordWriter *w)
{
	return nextval_internal(cache.id_sequence, false);
}

/*
 * Start the row to write: all NULL, or (from_old) a copy of the row
 * idem_writer_lock locked.  Returns its values, indexed by attribute number
 * minus one, and its null flags in *nulls, for the caller to fill in.
 */
Datum *
idem_writer_new_row(IdemRecordWriter *w, bool **nulls, bool from_old)
{
	TupleTableSlot *slot = w->new_slot;
	int			natts = slot->tts_tupleDescriptor->natts;

	ExecClearTuple(slot);
	if (from_old)
	{
		slot_getallattrs(w->old_slot);
		memcpy(slot->tts_values, w->old_slot->tts_values, natts * sizeof(Datum));
		memcpy(slot->tts_isnull, w->old_slot->tts_isnull, natts * sizeof(bool));
	}
	else
		memset(slot->tts_isnull, true, natts * sizeof(bool));
	*nulls = slot->tts_isnull;
	return slot->tts_values;
}

/*
 * Insert the row idem_writer_new_row started.  A key that is already taken
 * raises unique_violation, as an INSERT would.
 */
void
idem_writer_insert(IdemRecordWriter *w)
{
	MemoryContext oldcontext = MemoryContextSwitchTo(w->estate->es_query_cxt);

	ExecStoreVirtualTuple(w->new_slot);
	ExecSimpleRelationInsert(w->rri, w->estate, w->new_slot);
	MemoryContextSwitchTo(oldcontext);
}

/*
 * Find the record with this id and lock it for update, into w->old_slot.
 * Returns false when there is no such record (it was deleted), or with
 * LockWaitSkip when another transaction holds a lock on it.  Under READ
 * COMMITTED the row locked may be a newer version than the one found:
 * check it.
 */
bool
idem_writer_lock(IdemRecordWriter *w, int64 id, LockWaitPolicy wait)
{
	ScanKeyData key;
	IndexScanDesc scan;
	TM_FailureData tmfd;
	TM_Result	result;
	bool		found;

	/* see this statement's own earlier writes, as a statement would */
	CommandCounterIncrement();
	w->snapshot = RegisterSnapshot(GetTransactionSnapshot());
	w->estate->es_snapshot = w->snapshot;
	w->estate->es_output_cid = GetCurrentCommandId(true);

	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(id));
	scan = index_beginscan(w->rel,
						   opened_index(w, RelationGetPrimaryKeyIndex(w->rel)),
						   w->snapshot, 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, w->old_slot);
	index_endscan(scan);
	if (!found)
		return false;

	result = table_tuple_lock(w->rel, &w->old_slot->tts_tid, w->snapshot,
							  w->old_slot, w->estate->es_output_cid,
							  LockTupleNoKeyExclusive, wait,
							  IsolationUsesXactSnapshot() ? 0 :
							  TUPLE_LOCK_FLAG_FIND_LAST_VERSION,
							  &tmfd);
	switch (result)
	{
		case TM_Ok:
			return true;
		case TM_WouldBlock:
			return false;
		case TM_SelfModified:
			/* changed by this very command since: not the row we read */
			return false;
		case TM_Updated:
		case TM_Deleted:
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent update")));
			/* READ COMMITTED: the newest version was deleted */
			return false;
		case TM_Invisible:
			elog(ERROR, "attempted to lock invisible tuple");
			break;
		default:
			elog(ERROR, "unexpected table_tuple_lock status: %u", result);
			break;
	}
	return false;
}

/*
 * Replace the row idem_writer_lock locked with the one idem_writer_new_row
 * started.
 */
void
idem_writer_update(IdemRecordWriter *w)
{
	MemoryContext oldcontext = MemoryContextSwitchTo(w->estate->es_query_cxt);
	EPQState	epqstate;

	EvalPlanQualInit(&epqstate, w->estate, NULL, NIL, -1);
	ExecStoreVirtualTuple(w->new_slot);
	ExecSimpleRelationUpdate(w->rri, w->estate, &epqstate, w->old_slot,
							 w->new_slot);
	EvalPlanQualEnd(&epqstate);
	MemoryContextSwitchTo(oldcontext);
}

/*
 * Hand the executor the compiled CHECK constraints and partial index
 * predicates, so that it does not compile them again.
 */
static void
use_compiled_expressions(IdemRecordWriter *w)
{
	TupleConstr *constr = RelationGetDescr(w->rel)->constr;
	int			ncheck = constr != NULL ? constr->num_check : 0;
	int			i;
	int			j;

	/*
	 * Still marked in use: the last write using it ended in an error, or
	 * this write runs inside another one (a trigger on idem_records).
	 */
	if (cache_in_use)
		retire_cache();
	if (!cache_valid || cache.relid != RelationGetRelid(w->rel) ||
		cache.ncheck != ncheck)
	{
		retire_cache();
		build_cache(w);
	}
	cache_in_use = true;

	if (ncheck > 0)
		w->rri->ri_ConstraintExprs = cache.checks;
	for (i = 0; i < w->rri->ri_NumIndices; i++)
	{
		IndexInfo  *info = w->rri->ri_IndexRelationInfo[i];
		Oid			index_oid = RelationGetRelid(w->rri->ri_IndexRelationDescs[i]);

		if (info->ii_Predicate == NIL)
			continue;
		for (j = 0; j < cache.npredicates; j++)
			if (cache.predicate_index[j] == index_oid)
				info->ii_PredicateState = cache.predicate[j];
	}
}

/*
 * Compile the table's CHECK constraints and its indexes' predicates, as
 * ExecRelCheck and ExecInsertIndexTuples would, into a context of their own
 * that lives until the table changes.
 */
static void
build_cache(IdemRecordWriter *w)
{
	TupleDesc	desc = RelationGetDescr(w->rel);
	MemoryContext oldcontext;
	AttrNumber	identity = InvalidAttrNumber;
	int			i;

	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(invalidate_cache, (Datum) 0);
		callback_registered = true;
	}

	for (i = 0; i < desc->natts; i++)
		if (TupleDescAttr(desc, i)->attidentity != '\0' &&
			!TupleDescAttr(desc, i)->attisdropped)
			identity = i + 1;
	if (identity == InvalidAttrNumber)
		elog(ERROR, "idem_records has no identity column");

	cache.context = AllocSetContextCreate(CacheMemoryContext,
										  "idempotency compiled constraints",
										  ALLOCSET_SMALL_SIZES);
	oldcontext = MemoryContextSwitchTo(cache.context);

	cache.relid = RelationGetRelid(w->rel);
	cache.id_sequence = getIdentitySequence(cache.relid, identity, false);

	cache.ncheck = desc->constr != NULL ? desc->constr->num_check : 0;
	cache.checks = palloc0(Max(cache.ncheck, 1) * sizeof(ExprState *));
	for (i = 0; i < cache.ncheck; i++)
	{
		Expr	   *check = stringToNode(desc->constr->check[i].ccbin);

		cache.checks[i] = ExecInitExpr(expression_planner(check), NULL);
	}

	cache.npredicates = 0;
	cache.predicate_index = palloc0(Max(w->rri->ri_NumIndices, 1) * sizeof(Oid));
	cache.predicate = palloc0(Max(w->rri->ri_NumIndices, 1) * sizeof(ExprState *));
	for (i = 0; i < w->rri->ri_NumIndices; i++)
	{
		List	   *predicate = w->rri->ri_IndexRelationInfo[i]->ii_Predicate;

		if (predicate == NIL)
			continue;
		predicate = (List *) expression_planner((Expr *) copyObject(predicate));
		cache.predicate_index[cache.npredicates] =
			RelationGetRelid(w->rri->ri_IndexRelationDescs[i]);
		cache.predicate[cache.npredicates] = ExecInitQual(predicate, NULL);
		cache.npredicates++;
	}

	MemoryContextSwitchTo(oldcontext);
	cache_valid = true;
}

/*
 * Forget the compiled expressions.  A write of this transaction may still
 * hold them, so they are freed when the transaction ends.
 */
static void
retire_cache(void)
{
	if (cache.context != NULL)
		MemoryContextSetParent(cache.context, TopTransactionContext);
	cache.context = NULL;
	cache_valid = false;
	cache_in_use = false;
}

static void
invalidate_cache(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || relid == cache.relid)
		cache_valid = false;
}

/*
 * One of the indexes idem_writer_begin opened.
 */
static Relation
opened_index(IdemRecordWriter *w, Oid index_oid)
{
	int			i;

	for (i = 0; i < w->rri->ri_NumIndices; i++)
		if (RelationGetRelid(w->rri->ri_IndexRelationDescs[i]) == index_oid)
			return w->rri->ri_IndexRelationDescs[i];
	elog(ERROR, "index %u of idem_records is not open", index_oid);
	pg_unreachable();
}
