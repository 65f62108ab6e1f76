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
 * invalidated (any ALTER TABLE, CREATE or DROP INDEX), a function or type
 * changes, or an evaluation was interrupted by an error.  Expressions that
 * keep state in a statement's memory (a whole-row reference, say) are
 * compiled for each write instead.  An entry dropped while a write may still be
 * using it is freed at the end of the transaction, not at once.
 *
 * A write behaves like an INSERT or UPDATE of one row by the table's owner:
 * idem_writer_start fires the BEFORE STATEMENT triggers and idem_writer_end
 * the AFTER STATEMENT ones; a new row gets the defaults of the columns the
 * caller leaves NULL (compiled once, like the constraints), as an INSERT
 * that does not name them would, and its id is the identity column's
 * default, compiled and taken the same way (no privilege on the sequence
 * is needed, as for that INSERT); an UPDATE counts the columns the caller
 * says it sets as the ones updated, for UPDATE OF triggers.  Triggers with
 * transition tables are refused (a write cannot fill them), and so is any
 * write they would see.  A constraint error raised by a write loses its
 * DETAIL, which PostgreSQL fills with the row's values: the key, the scope,
 * the attempt token's secret.
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
#include "catalog/pg_trigger.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/optimizer.h"
#include "parser/parse_coerce.h"
#include "rewrite/rewriteHandler.h"
#include "storage/lmgr.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "catalog.h"
#include "pg_compat.h"
#include "record_writer.h"

/* What is compiled once per backend for the records table. */
typedef struct WriterCache
{
	MemoryContext context;		/* holds all of it; NULL when there is none */
	Oid			relid;
	int			ncheck;
	ExprState **checks;			/* in the order of rd_att->constr->check */
	int			npredicates;
	Oid		   *predicate_index;
	ExprState **predicate;
	int			ndefaults;
	AttrNumber *default_attnum;
	Expr	  **default_expr;
	ExprState **default_state;	/* NULL: compiled for each write */
} WriterCache;

/*
 * The cache in use.  It is replaced only by a complete build (build_cache
 * works on a struct of its own), so an error or a cancel during a rebuild
 * leaves the previous one, marked invalid, never half of a new one.
 */
static WriterCache cache;
static bool cache_valid = false;
static bool cache_in_use = false;
static bool callback_registered = false;

/*
 * The default of the identity column (a NextValueExpr), compiled once per
 * backend like the other defaults, with the expression context it is
 * evaluated in.  It is kept apart from WriterCache because a claim kept
 * pending allocates its id without opening a write.  Replaced only by a
 * complete build, as the cache is.
 */
typedef struct IdentityCache
{
	MemoryContext context;		/* holds all of it; NULL when there is none */
	Oid			relid;
	ExprState  *next_value;
	ExprContext *econtext;
} IdentityCache;

static IdentityCache identity;
static bool identity_valid = false;

/*
 * Invalidations seen, counted so that a build can tell whether one arrived
 * while it ran (catalog lookups take locks and so process them): such a
 * build is used for the write that made it, but not kept as valid.
 */
static uint64 invalidation_count = 0;
static Oid	building_relid = InvalidOid;

/*
 * DDL statements running in this backend (nested in event triggers, say),
 * counted by the utility hook of pending_claim.c: while one runs, a write
 * may be refused (idem_refuse_write_during_ddl).
 */
int			idem_ddl_depth = 0;

static void use_compiled_expressions(IdemRecordWriter *w);
static void build_cache(IdemRecordWriter *w, WriterCache *fresh);
static void build_identity(Relation rel);
static void register_callbacks(void);
static void retire_cache(void);
static void invalidate_cache(Datum arg, Oid relid);
static void invalidate_cache_syscache(Datum arg, int cacheid, uint32 hashvalue);
static bool needs_query_memory(Node *node, void *context);
static void refuse_transition_tables(IdemRecordWriter *w);
static void fill_defaults(IdemRecordWriter *w);
static bool held_exclusively(Oid relid);
static void refuse_write_during_ddl(Oid relid);

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
	idem_refuse_write_during_ddl();
	w->estate = CreateExecutorState();
	w->estate->es_output_cid = GetCurrentCommandId(true);

	oldcontext = MemoryContextSwitchTo(w->estate->es_query_cxt);

	/*
	 * A range table of the one table, as for a statement: its updatedCols
	 * is what UPDATE OF triggers and the row lock mode look at.
	 */
	w->rte = makeNode(RangeTblEntry);
	w->rte->rtekind = RTE_RELATION;
	w->rte->relid = RelationGetRelid(w->rel);
	w->rte->relkind = w->rel->rd_rel->relkind;
	w->rte->rellockmode = RowExclusiveLock;
	ExecInitRangeTable_compat(w->estate, w->rte);
	w->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(w->rri, w->rel, 1, NULL, 0);
	/* where AFTER triggers look for the table: not opened a second time */
	w->estate->es_opened_result_relations =
		lappend(w->estate->es_opened_result_relations, w->rri);
	ExecOpenIndices(w->rri, false);
	w->old_slot = table_slot_create(w->rel, &w->estate->es_tupleTable);
	w->new_slot = ExecInitExtraTupleSlot(w->estate, RelationGetDescr(w->rel),
										 &TTSOpsVirtual);
	use_compiled_expressions(w);
	/* a write from a trigger of this one may replace the cache meanwhile */
	w->compiled = memcpy(palloc(sizeof(WriterCache)), &cache, sizeof(WriterCache));
	MemoryContextSwitchTo(oldcontext);

	AfterTriggerBeginQuery();
}

/*
 * Start the statement the write stands for: an INSERT, or an UPDATE that
 * sets the given columns (what UPDATE OF triggers and the row lock look
 * at), and fire its BEFORE STATEMENT triggers.
 */
void
idem_writer_start(IdemRecordWriter *w, CmdType operation,
				  const AttrNumber *set_columns, int ncolumns)
{
	MemoryContext oldcontext = MemoryContextSwitchTo(w->estate->es_query_cxt);
	int			i;

	w->operation = operation;
	refuse_transition_tables(w);
	updatedCols_compat(w->estate, w->rte) = NULL;
	for (i = 0; i < ncolumns; i++)
		updatedCols_compat(w->estate, w->rte) =
			bms_add_member(updatedCols_compat(w->estate, w->rte),
						   set_columns[i] - FirstLowInvalidHeapAttributeNumber);
	if (operation == CMD_INSERT)
		ExecBSInsertTriggers(w->estate, w->rri);
	else
		ExecBSUpdateTriggers(w->estate, w->rri);
	MemoryContextSwitchTo(oldcontext);
}

/*
 * Fire the AFTER triggers the write queued and close everything
 * idem_writer_begin opened.
 */
void
idem_writer_end(IdemRecordWriter *w)
{
	MemoryContext caller = CurrentMemoryContext;

	if (w->operation == CMD_INSERT)
		ExecASInsertTriggers(w->estate, w->rri, NULL);
	else if (w->operation == CMD_UPDATE)
		ExecASUpdateTriggers(w->estate, w->rri, NULL);
	/* the foreign keys and deferrable unique keys checked at once */
	PG_TRY();
	{
		AfterTriggerEndQuery(w->estate);
	}
	PG_CATCH();
	{
		idem_rethrow_without_values(caller);
	}
	PG_END_TRY();
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
 * The next value of the identity column of rel (idem_records, opened by
 * the caller): its default, as an INSERT that leaves the column out
 * evaluates it.  Like that INSERT, it needs no privilege on the sequence.
 */
int64
idem_writer_next_id(Relation rel)
{
	bool		isnull;
	Datum		value;

	if (!identity_valid || identity.relid != RelationGetRelid(rel))
		build_identity(rel);
	value = ExecEvalExpr(identity.next_value, identity.econtext, &isnull);
	Assert(!isnull);
	return DatumGetInt64(value);
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
 * Insert the row idem_writer_new_row started; the columns left NULL get
 * their defaults.  A key that is already taken raises unique_violation, as
 * an INSERT would.
 */
void
idem_writer_insert(IdemRecordWriter *w)
{
	MemoryContext caller = CurrentMemoryContext;

	Assert(w->operation == CMD_INSERT);
	MemoryContextSwitchTo(w->estate->es_query_cxt);
	PG_TRY();
	{
		fill_defaults(w);
		ExecStoreVirtualTuple(w->new_slot);
		ExecSimpleRelationInsert(w->rri, w->estate, w->new_slot);
	}
	PG_CATCH();
	{
		idem_rethrow_without_values(caller);
	}
	PG_END_TRY();
	MemoryContextSwitchTo(caller);
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
	return idem_writer_read(w, id) && idem_writer_lock_read(w, wait);
}

/*
 * Find the record with this id, as committed now, into w->old_slot without
 * locking or waiting for anything.  Returns false when there is none.
 */
bool
idem_writer_read(IdemRecordWriter *w, int64 id)
{
	ScanKeyData key;
	IndexScanDesc scan;
	bool		found;

	/* see this statement's own earlier writes, as a statement would */
	CommandCounterIncrement();
	if (w->snapshot != NULL)
		UnregisterSnapshot(w->snapshot);
	w->snapshot = RegisterSnapshot(GetTransactionSnapshot());
	w->estate->es_snapshot = w->snapshot;
	w->estate->es_output_cid = GetCurrentCommandId(true);

	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(id));
	scan = index_beginscan_compat(w->rel,
								  idem_writer_index(w, idem_catalog()->id_index_oid),
								  w->snapshot, 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, w->old_slot);
	index_endscan(scan);
	return found;
}

/*
 * Lock the row idem_writer_read found, the way UPDATE locks it.  Returns
 * false when it is gone, or with LockWaitSkip when another transaction
 * holds a lock on it.  Under READ COMMITTED w->old_slot then holds the
 * newest version, which may differ from the one read: check it again.
 */
bool
idem_writer_lock_read(IdemRecordWriter *w, LockWaitPolicy wait)
{
	TM_FailureData tmfd;
	TM_Result	result;

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
	MemoryContext caller = CurrentMemoryContext;
	EPQState	epqstate;

	Assert(w->operation == CMD_UPDATE);
	MemoryContextSwitchTo(w->estate->es_query_cxt);
	EvalPlanQualInit_compat(&epqstate, w->estate, NULL, NIL, -1);
	PG_TRY();
	{
		ExecStoreVirtualTuple(w->new_slot);
		ExecSimpleRelationUpdate(w->rri, w->estate, &epqstate, w->old_slot,
								 w->new_slot);
	}
	PG_CATCH();
	{
		idem_rethrow_without_values(caller);
	}
	PG_END_TRY();
	EvalPlanQualEnd(&epqstate);
	MemoryContextSwitchTo(caller);
}

/*
 * Re-raise the error being handled.  An integrity constraint violation
 * (class 23: not-null, check, unique, foreign key, exclusion) loses its
 * DETAIL, where PostgreSQL shows the row's values ("Failing row contains
 * ...", "Key (...)=(...)"): the key, the scope, the attempt token's secret,
 * which neither the calling role, who may not read the table, nor the log
 * should see.  context is the memory context the caller was in.
 */
void
idem_rethrow_without_values(MemoryContext context)
{
	ErrorData  *edata;

	MemoryContextSwitchTo(context);
	edata = CopyErrorData();
	if (ERRCODE_TO_CATEGORY(edata->sqlerrcode) !=
		ERRCODE_INTEGRITY_CONSTRAINT_VIOLATION)
		PG_RE_THROW();
	FlushErrorState();
	edata->detail = edata->detail == NULL ? NULL :
		pstrdup("The values of the idempotency record are not shown.");
	edata->detail_log = NULL;
	ReThrowError(edata);
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
		WriterCache fresh;
		uint64		invalidations = invalidation_count;

		build_cache(w, &fresh);
		retire_cache();
		cache = fresh;
		cache_valid = invalidation_count == invalidations;
	}
	cache_in_use = true;

	if (ncheck > 0 && cache.checks != NULL)
		ri_CheckConstraintExprs_compat(w->rri) = cache.checks;
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
 * ExecRelCheck and ExecInsertIndexTuples would, into *fresh and a memory
 * context of its own.  The context hangs below the current one until the
 * build is complete, so that an error half-way frees it with the rest of
 * the statement; then it moves to CacheMemoryContext and lives until the
 * table changes (the way partdesc.c builds a partition descriptor).
 */
static void
build_cache(IdemRecordWriter *w, WriterCache *fresh)
{
	TupleDesc	desc = RelationGetDescr(w->rel);
	MemoryContext oldcontext;
	int			i;

	register_callbacks();
	memset(fresh, 0, sizeof(*fresh));
	fresh->relid = RelationGetRelid(w->rel);
	building_relid = fresh->relid;
	fresh->context = AllocSetContextCreate(CurrentMemoryContext,
										   "idempotency compiled constraints",
										   ALLOCSET_SMALL_SIZES);
	oldcontext = MemoryContextSwitchTo(fresh->context);

	/*
	 * The constraints are handed over all or none: one that keeps state in
	 * a statement's memory (see needs_query_memory) makes the executor
	 * compile them all for every write, as for a statement.
	 */
	fresh->ncheck = desc->constr != NULL ? desc->constr->num_check : 0;
	fresh->checks = palloc0(Max(fresh->ncheck, 1) * sizeof(ExprState *));
	for (i = 0; i < fresh->ncheck; i++)
	{
		Expr	   *check = check_constraint_expr_compat(w->rel,
														 &desc->constr->check[i]);

		if (check == NULL)
			continue;			/* not enforced: left NULL, as ExecRelCheck does */
		check = expression_planner(check);
		if (needs_query_memory((Node *) check, NULL))
		{
			fresh->checks = NULL;
			break;
		}
		fresh->checks[i] = ExecInitExpr(check, NULL);
	}

	fresh->predicate_index = palloc0(Max(w->rri->ri_NumIndices, 1) * sizeof(Oid));
	fresh->predicate = palloc0(Max(w->rri->ri_NumIndices, 1) * sizeof(ExprState *));
	for (i = 0; i < w->rri->ri_NumIndices; i++)
	{
		List	   *predicate = w->rri->ri_IndexRelationInfo[i]->ii_Predicate;

		if (predicate == NIL)
			continue;
		predicate = (List *) expression_planner((Expr *) copyObject(predicate));
		if (needs_query_memory((Node *) predicate, NULL))
			continue;
		fresh->predicate_index[fresh->npredicates] =
			RelationGetRelid(w->rri->ri_IndexRelationDescs[i]);
		fresh->predicate[fresh->npredicates] = ExecInitQual(predicate, NULL);
		fresh->npredicates++;
	}

	/*
	 * Defaults, as the rewriter would put them into an INSERT that does not
	 * name the column (a type's default included).  The identity column is
	 * always written (its default is build_identity's), generated columns
	 * are computed by the executor.
	 */
	fresh->default_attnum = palloc0(desc->natts * sizeof(AttrNumber));
	fresh->default_expr = palloc0(desc->natts * sizeof(Expr *));
	fresh->default_state = palloc0(desc->natts * sizeof(ExprState *));
	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		Node	   *def;
		Expr	   *expr;

		if (att->attisdropped || att->attidentity != '\0' ||
			att->attgenerated != '\0')
			continue;
		def = build_column_default(w->rel, i + 1);

		/*
		 * No default: NULL, but coerced to a domain as the planner does for
		 * an INSERT that leaves the column out (expand_insert_targetlist),
		 * so that a domain's NOT NULL or CHECK is enforced.
		 */
		if (def == NULL && get_typtype(att->atttypid) == TYPTYPE_DOMAIN)
			def = coerce_to_domain((Node *) makeConst(att->atttypid, -1,
													  att->attcollation,
													  att->attlen, (Datum) 0,
													  true, att->attbyval),
								   InvalidOid, -1, att->atttypid,
								   COERCION_IMPLICIT, COERCE_IMPLICIT_CAST,
								   -1, false);
		if (def == NULL)
			continue;
		expr = expression_planner((Expr *) def);
		fresh->default_attnum[fresh->ndefaults] = i + 1;
		fresh->default_expr[fresh->ndefaults] = expr;
		if (!needs_query_memory((Node *) expr, NULL))
			fresh->default_state[fresh->ndefaults] = ExecInitExpr(expr, NULL);
		fresh->ndefaults++;
	}

	MemoryContextSwitchTo(oldcontext);
	MemoryContextSetParent(fresh->context, CacheMemoryContext);
}

/*
 * Compile the default of rel's identity column, the NextValueExpr the
 * rewriter puts into an INSERT, into a memory context of its own that
 * replaces the one in use once the build is complete (as build_cache
 * does).  A build that saw an invalidation is used, not kept.
 */
static void
build_identity(Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	IdentityCache fresh;
	MemoryContext oldcontext;
	uint64		invalidations = invalidation_count;
	Node	   *def = NULL;
	int			i;

	register_callbacks();
	memset(&fresh, 0, sizeof(fresh));
	fresh.relid = RelationGetRelid(rel);
	building_relid = fresh.relid;
	fresh.context = AllocSetContextCreate(CurrentMemoryContext,
										  "idempotency identity",
										  ALLOCSET_SMALL_SIZES);
	oldcontext = MemoryContextSwitchTo(fresh.context);
	for (i = 0; i < desc->natts && def == NULL; i++)
		if (TupleDescAttr(desc, i)->attidentity != '\0' &&
			!TupleDescAttr(desc, i)->attisdropped)
			def = build_column_default(rel, i + 1);
	if (def == NULL)
		elog(ERROR, "idem_records has no identity column");
	fresh.next_value = ExecInitExpr((Expr *) def, NULL);
	fresh.econtext = CreateStandaloneExprContext();
	MemoryContextSwitchTo(oldcontext);
	MemoryContextSetParent(fresh.context, CacheMemoryContext);

	/* no evaluation of the old one is under way: it calls nothing of ours */
	if (identity.context != NULL)
		MemoryContextDelete(identity.context);
	identity = fresh;
	identity_valid = invalidation_count == invalidations;
}

/*
 * Watch the table, and the functions and types its expressions use.
 */
static void
register_callbacks(void)
{
	if (callback_registered)
		return;
	CacheRegisterRelcacheCallback(invalidate_cache, (Datum) 0);
	CacheRegisterSyscacheCallback(PROCOID, invalidate_cache_syscache, (Datum) 0);
	CacheRegisterSyscacheCallback(TYPEOID, invalidate_cache_syscache, (Datum) 0);
	callback_registered = true;
}

/*
 * Give the columns of the new row that the caller left NULL their
 * defaults.  Runs in the write's memory.
 */
static void
fill_defaults(IdemRecordWriter *w)
{
	const WriterCache *compiled = w->compiled;
	TupleTableSlot *slot = w->new_slot;
	ExprContext *econtext = GetPerTupleExprContext(w->estate);
	int			i;

	for (i = 0; i < compiled->ndefaults; i++)
	{
		int			att = compiled->default_attnum[i] - 1;
		ExprState  *state = compiled->default_state[i];

		if (!slot->tts_isnull[att])
			continue;
		if (state == NULL)
			state = ExecInitExpr(compiled->default_expr[i], NULL);
		slot->tts_values[att] = ExecEvalExpr(state, econtext,
											 &slot->tts_isnull[att]);
	}
}

/*
 * Refuse a write that triggers with transition tables would see: the
 * executor-free write has no way to fill them.
 */
static void
refuse_transition_tables(IdemRecordWriter *w)
{
	TriggerDesc *trigdesc = w->rri->ri_TrigDesc;
	int			i;

	if (trigdesc == NULL ||
		!(w->operation == CMD_INSERT ? trigdesc->trig_insert_new_table :
		  trigdesc->trig_update_old_table || trigdesc->trig_update_new_table))
		return;
	for (i = 0; i < trigdesc->numtriggers; i++)
	{
		Trigger    *trigger = &trigdesc->triggers[i];
		int16		event = w->operation == CMD_INSERT ?
			TRIGGER_TYPE_INSERT : TRIGGER_TYPE_UPDATE;

		if ((trigger->tgtype & event) != 0 &&
			(trigger->tgoldtable != NULL || trigger->tgnewtable != NULL))
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("idempotency records cannot be written while trigger \"%s\" on \"%s\" uses transition tables",
							trigger->tgname, RelationGetRelationName(w->rel)),
					 errdetail("Claims and completions write their row without a statement, which cannot fill transition tables."),
					 errhint("Drop the trigger, or make it a row-level trigger or a statement-level trigger without REFERENCING.")));
	}
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
	memset(&cache, 0, sizeof(cache));
	cache_valid = false;
	cache_in_use = false;
}

/*
 * Relcache callback: the table (or every relation) changed.
 */
static void
invalidate_cache(Datum arg pg_attribute_unused(), Oid relid)
{
	if (!OidIsValid(relid) || relid == cache.relid ||
		relid == identity.relid || relid == building_relid)
	{
		cache_valid = false;
		identity_valid = false;
		invalidation_count++;
	}
}

/*
 * Syscache callback: a function or a type changed.
 */
static void
invalidate_cache_syscache(Datum arg pg_attribute_unused(),
						  int cacheid pg_attribute_unused(),
						  uint32 hashvalue pg_attribute_unused())
{
	cache_valid = false;
	identity_valid = false;
	invalidation_count++;
}

/*
 * Whether an expression keeps state in the memory of the statement that
 * evaluates it (ExecEvalWholeRowVar, ExecEvalConvertRowtype and hashed
 * ScalarArrayOps do, on first use): such an expression cannot outlive one
 * write, and is compiled for each.
 */
static bool
needs_query_memory(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (IsA(node, Var) && ((Var *) node)->varattno == InvalidAttrNumber)
		return true;
	if (IsA(node, ConvertRowtypeExpr))
		return true;
	if (IsA(node, ScalarArrayOpExpr) &&
		OidIsValid(((ScalarArrayOpExpr *) node)->hashfuncid))
		return true;
	return expression_tree_walker(node, needs_query_memory, context);
}

/*
 * One of the indexes idem_writer_begin opened.
 */
Relation
idem_writer_index(IdemRecordWriter *w, Oid index_oid)
{
	int			i;

	for (i = 0; i < w->rri->ri_NumIndices; i++)
		if (RelationGetRelid(w->rri->ri_IndexRelationDescs[i]) == index_oid)
			return w->rri->ri_IndexRelationDescs[i];
	elog(ERROR, "index %u of idem_records is not open", index_oid);
	pg_unreachable();
}

/*
 * Refuse a write to idem_records while a DDL statement runs in a
 * transaction that holds the table, or its archive, exclusively: the
 * statement may be rewriting it (ALTER COLUMN TYPE, a volatile default,
 * CLUSTER), and a row written or changed now, from an expression the
 * statement evaluates, would go to the storage the rewrite discards; the
 * key would answer proceed again, or a record be deleted with its copy
 * lost.  Every write of the extension's calls this first: a new record, a
 * new attempt, a lease marked unknown, a resolution, the lease and cleanup
 * passes.  A DDL statement is known only with the library preloaded, or
 * loaded before the statement began.
 */
void
idem_refuse_write_during_ddl(void)
{
	const IdemCatalog *cat;
	Oid			archive;

	if (idem_ddl_depth == 0)
		return;
	cat = idem_catalog();
	archive = get_relname_relid(IDEM_ARCHIVE_TABLE, cat->schema_oid);
	if (held_exclusively(cat->table_oid))
		refuse_write_during_ddl(cat->table_oid);
	if (OidIsValid(archive) && held_exclusively(archive))
		refuse_write_during_ddl(archive);
}

/*
 * Whether this transaction holds relid in ACCESS EXCLUSIVE mode.  Only the
 * relcache entry's lock tag is read: no lock is taken.  A relation dropped
 * meanwhile is not held.
 */
static bool
held_exclusively(Oid relid)
{
	Relation	rel = RelationIdGetRelation(relid);
	bool		held;

	if (rel == NULL)
		return false;
	held = CheckRelationLockedByMe(rel, AccessExclusiveLock, false);
	RelationClose(rel);
	return held;
}

/* The error for a write while a DDL statement may be rewriting relid. */
static void
refuse_write_during_ddl(Oid relid)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_IN_USE),
			 errmsg("cannot write an idempotency record in a DDL statement while this transaction holds table \"%s\" exclusively",
					get_rel_name(relid)),
			 errdetail("The statement may be rewriting the table, and the record would be lost with its old storage."),
			 errhint("Claim, complete and clean up keys outside DDL statements, or once the transaction that altered the table has committed.")));
}
