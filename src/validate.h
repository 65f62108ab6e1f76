/*-------------------------------------------------------------------------
 *
 * validate.h
 *	  Checks of the arguments of the idem_* functions.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_VALIDATE_H
#define IDEM_VALIDATE_H

#include "fmgr.h"
#include "utils/jsonb.h"

#include "state_machine.h"

/* idempotency.max_key_length, idempotency.max_response_size */
extern int	idem_max_key_length;
extern int	idem_max_response_size;

extern void idem_validate_init(void);
extern void idem_require_arg(FunctionCallInfo fcinfo, int argno, const char *name);
extern void idem_check_key(text *key);
extern void idem_check_name(text *value, const char *what, bool allow_empty);
/*
 * The longest ttl, lease or wait accepted, in days (about 1,000 years): far
 * beyond any use, and far enough from the end of timestamps that applying
 * it from any date a record can live to stays in range.
 */
#define IDEM_MAX_INTERVAL_DAYS INT64CONST(365250)

extern int64 idem_interval_usecs(Interval *value, const char *what, bool allow_zero);
extern TimestampTz idem_interval_end(TimestampTz start, Interval *value);
extern TimestampTz idem_timestamp_plus(TimestampTz start, int64 usecs, const char *what);
extern void idem_check_http_status(int32 status);
extern void idem_check_headers(Jsonb *headers);
extern IdemLeasePolicy idem_parse_policy(text *policy);
extern bool idem_parse_on_expired(text *value);
extern void idem_check_response_size(FunctionCallInfo fcinfo, int body_arg,
									 int headers_arg, int resource_arg,
									 int raw_body_arg);
extern void idem_check_stored_size(Datum value, const char *what);

#endif							/* IDEM_VALIDATE_H */
