/*-------------------------------------------------------------------------
 *
 * token.h
 *	  The fencing token that names one attempt of one record.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TOKEN_H
#define IDEM_TOKEN_H

#include "records.h"

extern void idem_token_new_secret(uint8 *secret);
extern text *idem_token_format(const IdemToken *token);
extern void idem_token_parse(text *value, IdemToken *token);

#endif							/* IDEM_TOKEN_H */
