/*-------------------------------------------------------------------------
 *
 * pg_compat.h
 *	  Every difference between the PostgreSQL major versions the extension
 *	  builds against, in one place.
 *
 * The extension is built and tested on PostgreSQL 15 and 18.  16 and 17
 * are guarded too, at the version that changed each call: every guard was
 * checked against the release that brought the change (16: settings'
 * memory, object_ownercheck, RTEPermissionInfo, EvalPlanQualInit's result
 * relations, the JSON parser's callbacks' result; 17: the JSON lexer's
 * context; 18: the rest), but 16 and 17 are neither built nor tested
 * here.
 *
 * Each macro below is named after the call it stands
 * for, with _compat appended, and takes the arguments of the oldest
 * version, so that a call site reads the same on every version; the
 * version-specific arguments are filled in here.  pg_noreturn, new in 18,
 * is defined for the older versions under its own name.
 *
 * They are macros, so that a file including this one pulls in no more of
 * PostgreSQL's headers than it uses: the file using one includes the
 * headers of the call it wraps, as it would to make the call itself.  Only
 * the headers of what a later version adds are included here.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_PG_COMPAT_H
#define IDEM_PG_COMPAT_H

#if PG_VERSION_NUM >= 160000
#include "parser/parse_relation.h"
#endif
#if PG_VERSION_NUM >= 180000
#include "rewrite/rewriteHandler.h"
#endif

/*
 * 18: pg_attribute_noreturn(), written after a declaration, is gone;
 * pg_noreturn goes before it.
 */
#if PG_VERSION_NUM < 180000
#define pg_noreturn pg_attribute_noreturn()
#endif

/*
 * 16: settings live in a memory context of their own, where a check hook
 * allocates its extra with guc_malloc (guc_free releases it, with pfree);
 * before, with malloc (released with free).
 */
#if PG_VERSION_NUM >= 160000
#define guc_malloc_compat(size) guc_malloc(LOG, (size))
#else
#define guc_malloc_compat(size) malloc(size)
#endif

/* 16: pg_class_ownercheck gave way to object_ownercheck. */
#if PG_VERSION_NUM >= 160000
#define pg_class_ownercheck_compat(relid, roleid) \
	object_ownercheck(RelationRelationId, (relid), (roleid))
#else
#define pg_class_ownercheck_compat(relid, roleid) \
	pg_class_ownercheck((relid), (roleid))
#endif

/*
 * 16: the callbacks of PostgreSQL's JSON parser return an error code.  A
 * callback is declared to return json_action_result_compat and returns
 * with json_action_done_compat.
 */
#if PG_VERSION_NUM >= 160000
#define json_action_result_compat JsonParseErrorType
#define json_action_done_compat return JSON_SUCCESS
#else
#define json_action_result_compat void
#define json_action_done_compat return
#endif

/*
 * 17: makeJsonLexContextCstringLen takes the context to fill in (NULL: a
 * new one), and its text is const.
 */
#if PG_VERSION_NUM >= 170000
#define makeJsonLexContextCstringLen_compat(json, len, encoding, need_escapes) \
	makeJsonLexContextCstringLen(NULL, (json), (len), (encoding), (need_escapes))
#else
#define makeJsonLexContextCstringLen_compat(json, len, encoding, need_escapes) \
	makeJsonLexContextCstringLen((char *) (json), (len), (encoding), (need_escapes))
#endif

/* 18: index_beginscan takes instrumentation, none here. */
#if PG_VERSION_NUM >= 180000
#define index_beginscan_compat(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), (norderbys))
#else
#define index_beginscan_compat(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), (nkeys), (norderbys))
#endif

/* 16: EvalPlanQualInit takes the result relations, none here. */
#if PG_VERSION_NUM >= 160000
#define EvalPlanQualInit_compat(epqstate, parentestate, subplan, auxrowmarks, epqParam) \
	EvalPlanQualInit((epqstate), (parentestate), (subplan), (auxrowmarks), \
					 (epqParam), NIL)
#else
#define EvalPlanQualInit_compat(epqstate, parentestate, subplan, auxrowmarks, epqParam) \
	EvalPlanQualInit((epqstate), (parentestate), (subplan), (auxrowmarks), \
					 (epqParam))
#endif

/*
 * A range table of one relation, rte, for an executor state that writes
 * it.  16: the permissions and the columns updated moved from the range
 * table entry to an RTEPermissionInfo, given beside the range table;
 * 18: so are the relations left after pruning, here the one.
 */
#if PG_VERSION_NUM >= 180000
#define ExecInitRangeTable_perminfos_(estate, rangeTable, permInfos) \
	ExecInitRangeTable((estate), (rangeTable), (permInfos), \
					   bms_make_singleton(1))
#elif PG_VERSION_NUM >= 160000
#define ExecInitRangeTable_perminfos_(estate, rangeTable, permInfos) \
	ExecInitRangeTable((estate), (rangeTable), (permInfos))
#endif
#if PG_VERSION_NUM >= 160000
#define ExecInitRangeTable_compat(estate, rte) \
	do { \
		List	   *perminfos_ = NIL; \
		\
		addRTEPermissionInfo(&perminfos_, (rte)); \
		ExecInitRangeTable_perminfos_((estate), list_make1(rte), perminfos_); \
	} while (0)
#else
#define ExecInitRangeTable_compat(estate, rte) \
	ExecInitRangeTable((estate), list_make1(rte))
#endif

/*
 * The columns an UPDATE of rte sets (what UPDATE OF triggers and the row
 * lock mode look at), as an lvalue.  16: kept in its RTEPermissionInfo.
 */
#if PG_VERSION_NUM >= 160000
#define updatedCols_compat(estate, rte) \
	(getRTEPermissionInfo((estate)->es_rteperminfos, (rte))->updatedCols)
#else
#define updatedCols_compat(estate, rte) ((rte)->updatedCols)
#endif

/*
 * The compiled CHECK constraints of a result relation, as an lvalue.
 * 18: renamed ri_CheckConstraintExprs.
 */
#if PG_VERSION_NUM >= 180000
#define ri_CheckConstraintExprs_compat(rri) ((rri)->ri_CheckConstraintExprs)
#else
#define ri_CheckConstraintExprs_compat(rri) ((rri)->ri_ConstraintExprs)
#endif

/*
 * The expression of a CHECK constraint of rel as ExecRelCheck compiles it
 * (before expression_planner), or NULL when the constraint is not checked.
 * 18: a constraint may be NOT ENFORCED, and virtual generated columns are
 * expanded in it.
 */
#if PG_VERSION_NUM >= 180000
#define check_constraint_expr_compat(rel, check) \
	((check)->ccenforced ? \
	 (Expr *) expand_generated_columns_in_expr(stringToNode((check)->ccbin), \
											   (rel), 1) : \
	 (Expr *) NULL)
#else
#define check_constraint_expr_compat(rel, check) \
	((void) (rel), (Expr *) stringToNode((check)->ccbin))
#endif

#endif							/* IDEM_PG_COMPAT_H */
