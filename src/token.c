/*-------------------------------------------------------------------------
 *
 * token.c
 *	  The fencing token that names one attempt of one record.
 *
 * A token reads "<record id>.<attempt>.<32 hex digits>".  The hex digits are
 * a random secret stored with the attempt; a write with the token succeeds
 * only while the record is processing that very attempt.  The secret, not
 * the attempt number, is what fences: a record reused after it expired
 * starts again at attempt 1, and a token of an earlier life of the record
 * must not match it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "utils/builtins.h"

#include "pg_compat.h"
#include "token.h"

pg_noreturn static void invalid_token(void);
static bool plain_number_at(const char *s);

/*
 * A new random secret for an attempt.
 */
void
idem_token_new_secret(uint8 *secret)
{
	if (!pg_strong_random(secret, IDEM_TOKEN_SECRET_LEN))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate a random attempt token")));
}

/*
 * The token's text form.
 */
text *
idem_token_format(const IdemToken *token)
{
	char		hex[IDEM_TOKEN_SECRET_LEN * 2 + 1];

	hex_encode((const char *) token->secret, IDEM_TOKEN_SECRET_LEN, hex);
	hex[IDEM_TOKEN_SECRET_LEN * 2] = '\0';
	return cstring_to_text(psprintf(INT64_FORMAT ".%d.%s",
									token->record_id, token->attempt, hex));
}

/*
 * Parse a token's text form, raising when it is not one.
 */
void
idem_token_parse(text *value, IdemToken *token)
{
	char	   *s = text_to_cstring(value);
	char	   *end;
	char	   *hex;
	long long	id;
	long		attempt;
	int			i;

	/*
	 * Exactly the form idem_token_format writes: strtoll and strtol alone
	 * would also take blanks, signs and leading zeros.
	 */
	if (!plain_number_at(s))
		invalid_token();
	errno = 0;
	id = strtoll(s, &end, 10);
	if (errno != 0 || end == s || *end != '.' || id <= 0)
		invalid_token();
	s = end + 1;
	if (!plain_number_at(s))
		invalid_token();
	attempt = strtol(s, &end, 10);
	if (errno != 0 || end == s || *end != '.' || attempt <= 0 || attempt > INT_MAX)
		invalid_token();
	hex = end + 1;
	if (strlen(hex) != IDEM_TOKEN_SECRET_LEN * 2)
		invalid_token();
	for (i = 0; i < IDEM_TOKEN_SECRET_LEN * 2; i++)
		if (!((hex[i] >= '0' && hex[i] <= '9') || (hex[i] >= 'a' && hex[i] <= 'f')))
			invalid_token();
	hex_decode(hex, IDEM_TOKEN_SECRET_LEN * 2, (char *) token->secret);
	token->record_id = (int64) id;
	token->attempt = (int32) attempt;
}

/*
 * Whether s starts with a decimal number without sign, blanks or leading
 * zeros.
 */
static bool
plain_number_at(const char *s)
{
	return s[0] >= '1' && s[0] <= '9';
}

static void
invalid_token(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid attempt token"),
			 errhint("Pass the token idem_claim returned with outcome \"proceed\".")));
}
