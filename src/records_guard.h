/*-------------------------------------------------------------------------
 *
 * records_guard.h
 *	  The idem_records_guard trigger, which holds every INSERT and UPDATE
 *	  of idem_records to the state machine.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_RECORDS_GUARD_H
#define IDEM_RECORDS_GUARD_H

#include "access/tupdesc.h"

extern void idem_guard_allow_finished_insert(bool allow);
extern AttrNumber idem_column_number(TupleDesc tupdesc, const char *name);

#endif							/* IDEM_RECORDS_GUARD_H */
