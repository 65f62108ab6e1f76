/*-------------------------------------------------------------------------
 *
 * record_writer.h
 *	  Executor-free inserts and updates of idem_records.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_RECORD_WRITER_H
#define IDEM_RECORD_WRITER_H

#include "access/skey.h"
#include "executor/tuptable.h"
#include "nodes/execnodes.h"
#include "nodes/lockoptions.h"
#include "nodes/nodes.h"
#include "nodes/parsenodes.h"
#include "utils/relcache.h"

#include "pg_compat.h"

struct WriterCache;

/* One write to idem_records, from idem_writer_begin to idem_writer_end. */
typedef struct IdemRecordWriter
{
	Relation	rel;
	const struct WriterCache *compiled; /* constraints, predicates, defaults */
	CmdType		operation;		/* set by idem_writer_start */
	EState	   *estate;
	RangeTblEntry *rte;			/* the range table's one entry */
	ResultRelInfo *rri;
	Snapshot	snapshot;		/* registered while set */
	TupleTableSlot *old_slot;	/* the row idem_writer_lock locked */
	TupleTableSlot *new_slot;	/* the row to write, virtual, full width */
} IdemRecordWriter;

extern void idem_writer_begin(IdemRecordWriter *w);
extern void idem_writer_start(IdemRecordWriter *w, CmdType operation,
							  const AttrNumber *set_columns, int ncolumns);
extern void idem_writer_end(IdemRecordWriter *w);
extern Relation idem_writer_index(IdemRecordWriter *w, Oid index_oid);
extern int64 idem_writer_next_id(Relation rel);
extern Datum *idem_writer_new_row(IdemRecordWriter *w, bool **nulls,
								  bool from_old);
extern void idem_writer_insert(IdemRecordWriter *w);
extern bool idem_writer_lock(IdemRecordWriter *w, int64 id,
							 LockWaitPolicy wait);
extern bool idem_writer_read(IdemRecordWriter *w, int64 id);
extern bool idem_writer_lock_read(IdemRecordWriter *w, LockWaitPolicy wait);
extern void idem_writer_update(IdemRecordWriter *w);
pg_noreturn extern void idem_rethrow_without_values(MemoryContext context);

/* DDL statements running in this backend; the writes they refuse */
extern int	idem_ddl_depth;
extern void idem_refuse_write_during_ddl(void);

#endif							/* IDEM_RECORD_WRITER_H */
