/*-------------------------------------------------------------------------
 *
 * canonical.c
 *	  Canonical JSON (RFC 8785 with exact numbers) of a jsonb value, and the
 *	  request fingerprint: the SHA-256 of that text.
 *
 * The canonical form is RFC 8785's (JSON Canonicalization Scheme): object
 * members sorted by the UTF-16 code units of their names, strings escaped
 * the RFC 8785 way, no whitespace, literals as they are.  Numbers differ on
 * purpose: RFC 8785 rounds every number to an IEEE double first, which would
 * give 0.10000000000000000001 and 0.1 the same fingerprint.  We write the
 * exact decimal value of the jsonb numeric in ECMAScript Number::toString
 * form instead, so the output is RFC 8785's for every number of at most 15
 * significant digits and longer numbers keep all their digits.
 *
 * Design note.  The fingerprint is computed for every claim, so it walks the
 * jsonb's binary containers directly instead of going through
 * JsonbIterator (which copies every value into a JsonbValue and pallocs a
 * frame per container).  The walk is iterative, with an explicit stack of
 * frames, so that the deepest document jsonb can hold never overflows the C
 * stack.  Output goes to a small buffer that is either grown (for the text)
 * or fed to SHA-256 whenever it fills up (for the fingerprint), so the
 * fingerprint of a 1 MB document never builds a 1 MB string.
 *
 * Object members in a jsonb container are stored sorted by (length, bytes).
 * Canonical order is by UTF-16 code units; UTF-8 byte order already equals
 * code point order, which differs from UTF-16 order only between characters
 * outside the BMP (surrogate pairs, 0xD800-0xDFFF in UTF-16) and characters
 * in U+E000-U+FFFF.  Members are re-sorted by their bytes mapped to correct
 * exactly that (utf16_order_byte), the first 8 of them compared as one
 * integer.  Strings are scanned 8 bytes at a time for bytes to escape, and
 * numbers are formatted from the base-10000 digits of the stored numeric,
 * without numeric_out and its allocation.
 *
 * The same canonical text is also written straight from JSON text, for
 * idem_claim_text (idem_fingerprint_json_text, at the end of this file):
 * no jsonb value is built, and the text is read once.  It must give the
 * jsonb's digest for every text jsonb_in accepts and jsonb_in's error for
 * every other, so whatever its own reader does not take is read by
 * PostgreSQL's JSON parser, the one jsonb_in uses.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/cryptohash.h"
#include "common/jsonapi.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "port/pg_bswap.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/jsonfuncs.h"
#include "utils/memutils.h"
#include "utils/numeric.h"

#include "canonical.h"
#include "pg_compat.h"
#include "sha256.h"

PG_FUNCTION_INFO_V1(idem_canonical);
PG_FUNCTION_INFO_V1(idem_fingerprint);

/*
 * Size of the buffer fed to SHA-256 in one call: big enough that the
 * per-call overhead of the hash is amortised, small enough to stay in L1.
 */
#define CANON_HASH_CHUNK	8192

/* Initial size of the buffer that collects the canonical text. */
#define CANON_TEXT_INITIAL	1024

/*
 * Where the canonical text goes.  In hash mode the buffer is flushed into
 * the hash whenever it fills up; a text that never fills it is hashed in
 * one call by sha256.c at the end, and the hash context is only created
 * for longer texts.  Otherwise the buffer grows and ends up holding the
 * whole text, after "start" bytes reserved for a varlena header.
 */
typedef struct CanonSink
{
	char	   *buf;
	Size		len;			/* bytes used in buf, including start */
	Size		cap;			/* bytes allocated in buf */
	Size		start;			/* bytes reserved at the head of buf */
	bool		hashing;		/* false: keep the text */
	pg_cryptohash_ctx *hash;	/* once the text outgrew the buffer */
} CanonSink;

/*
 * One member of an object being written: where its name and value are.
 * Offsets are relative to the data area of the object's container.
 */
typedef struct CanonMember
{
	uint64		prefix;			/* see member_name_prefix */
	const char *key;
	uint32		keylen;
	uint32		valoff;
	uint32		vallen;
	JEntry		valentry;
	uint32		order;			/* from JSON text: position in the object */
	bool		plain;			/* from JSON text: a name without escapes */
} CanonMember;

/* One open container of the walk. */
typedef struct CanonFrame
{
	JsonbContainer *jc;
	char	   *base;			/* start of the children's data */
	uint32		count;			/* elements, or members of an object */
	uint32		next;			/* next element or member to write */
	uint32		offset;			/* arrays: offset of the next element */
	uint32		members;		/* objects: first member in the member stack */
	bool		is_object;
} CanonFrame;

/* The explicit stacks of the walk, kept across containers. */
typedef struct CanonWalk
{
	CanonFrame *frames;
	int			nframes;
	int			maxframes;
	CanonMember *members;
	uint32		nmembers;
	uint32		maxmembers;
} CanonWalk;

static char *canonical_text(Jsonb *jb, Size start, Size *len);
static void canonical_write(JsonbContainer *root, CanonSink *sink);
static void push_container(CanonWalk *walk, CanonSink *sink,
						   JsonbContainer *jc);
static void write_scalar(CanonSink *sink, JEntry entry, char *base,
						 uint32 offset, uint32 length);
static void write_string(CanonSink *sink, const char *s, uint32 len);
static char *numeric_digits(Numeric num, char *localbuf, int localsize,
							int *ndigits, int *point, bool *negative);
static void write_number(CanonSink *sink, Numeric num);
static void write_decimal(CanonSink *sink, char *digits, int ndigits,
						  int point, bool negative);
static void sink_flush(CanonSink *sink);
static void sink_reserve(CanonSink *sink, Size need);

/*
 * Map a byte of UTF-8 so that byte order becomes UTF-16 code unit order.
 *
 * Byte order of UTF-8 is code point order.  It differs from UTF-16 order
 * only between characters outside the BMP (lead byte 0xF0-0xF4; in UTF-16,
 * surrogates 0xD800-0xDFFF) and characters in U+E000-U+FFFF (lead byte 0xEE
 * or 0xEF), which UTF-16 puts after them.  Moving 0xF0-0xF4 down to
 * 0xEE-0xF2 and 0xEE-0xEF up to 0xF3-0xF4 fixes exactly that and keeps
 * every other order.  Where two names first differ, the bytes are either
 * lead bytes in both or continuation bytes (below 0xC0, unchanged) in both,
 * since the names agree up to there, so comparing mapped bytes compares
 * the characters' UTF-16 forms.
 */
static inline unsigned char
utf16_order_byte(unsigned char c)
{
	if (c < 0xEE || c > 0xF4)
		return c;
	return c >= 0xF0 ? c - 2 : c + 5;
}

/*
 * The first 8 bytes of a member name, mapped with utf16_order_byte, as a
 * big-endian integer padded with zeros (jsonb strings hold no NUL), so that
 * most comparisons while sorting are one integer comparison.
 */
static inline uint64
member_name_prefix(const char *key, uint32 keylen)
{
	uint64		word = 0;

	memcpy(&word, key, Min(keylen, sizeof(uint64)));
	if (word & UINT64CONST(0x8080808080808080))
	{
		unsigned char *b = (unsigned char *) &word;
		int			i;

		for (i = 0; i < (int) sizeof(uint64); i++)
			b[i] = utf16_order_byte(b[i]);
	}
	return pg_ntoh64(word);
}

/*
 * Compare two member names by UTF-16 code units: by their prefixes, then
 * by the rest of their mapped bytes, then by length.
 */
static inline int
compare_member_names(const CanonMember *a, const CanonMember *b)
{
	uint32		minlen;
	uint32		i;

	if (a->prefix != b->prefix)
		return a->prefix < b->prefix ? -1 : 1;

	minlen = Min(a->keylen, b->keylen);
	for (i = sizeof(uint64); i < minlen; i++)
	{
		unsigned char ca = (unsigned char) a->key[i];
		unsigned char cb = (unsigned char) b->key[i];

		if (ca != cb)
			return utf16_order_byte(ca) < utf16_order_byte(cb) ? -1 : 1;
	}
	if (a->keylen == b->keylen)
		return 0;
	return a->keylen < b->keylen ? -1 : 1;
}

#define ST_SORT sort_members
#define ST_ELEMENT_TYPE CanonMember
#define ST_COMPARE(a, b) compare_member_names(a, b)
#define ST_SCOPE static
#define ST_DEFINE
#include "lib/sort_template.h"

/*
 * Members of an object read from JSON text, by name, and among members of
 * the same name the later first: jsonb keeps the last of them, and so
 * does the text path (text_object_end).
 */
static inline int
compare_text_members(const CanonMember *a, const CanonMember *b)
{
	int			c = compare_member_names(a, b);

	if (c != 0)
		return c;
	return a->order > b->order ? -1 : (a->order < b->order ? 1 : 0);
}

#define ST_SORT sort_text_members
#define ST_ELEMENT_TYPE CanonMember
#define ST_COMPARE(a, b) compare_text_members(a, b)
#define ST_SCOPE static
#define ST_DEFINE
#include "lib/sort_template.h"

/*
 * Bytes of a string that RFC 8785 escapes with a short sequence; 'u' marks
 * the other control characters, written as \u00xx; 0 means "copy as is".
 * Everything at or above 0x20 other than '"' and '\\' is copied, including
 * DEL, U+2028 and U+2029 (RFC 8785 section 3.2.2.2).
 */
static const char escape_table[256] = {
	'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'b', 't', 'n', 'u', 'f', 'r', 'u', 'u',
	'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u',
	0, 0, '"', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, '\\', 0, 0, 0,
	/* the rest is zero */
};

/*
 * The stored form of a numeric, as src/backend/utils/adt/numeric.c defines
 * it (it exports no accessor for the digits).  Data files and pg_upgrade
 * depend on this layout, so it is as stable as the on-disk format itself;
 * the regression tests check every branch against known texts.
 *
 * After the varlena header comes a uint16 whose top two bits give the form:
 * 00 positive and 01 negative (long form: uint16 sign and display scale,
 * then int16 weight), 10 short form (sign in bit 0x2000, display scale,
 * weight in the low 7 bits with 0x0040 as its sign), 11 NaN or infinity.
 * Then come the base-10000 digits as int16, most significant first: the
 * value is the sum of digit[i] * 10000^(weight - i).
 */
#define CANON_NUMERIC_FORM_MASK			0xC000
#define CANON_NUMERIC_NEG				0x4000
#define CANON_NUMERIC_SHORT				0x8000
#define CANON_NUMERIC_SPECIAL			0xC000
#define CANON_NUMERIC_SHORT_SIGN		0x2000
#define CANON_NUMERIC_SHORT_WEIGHT_SIGN	0x0040
#define CANON_NUMERIC_SHORT_WEIGHT_MASK	0x003F
#define CANON_NBASE						10000
#define CANON_DEC_DIGITS				4

/* ---------------------------------------------------------------------
 * SQL-callable functions
 * ---------------------------------------------------------------------
 */

/*
 * idem_canonical(jsonb) RETURNS text: the canonical text of a value.
 */
Datum
idem_canonical(PG_FUNCTION_ARGS)
{
	Jsonb	   *jb = PG_GETARG_JSONB_P(0);
	Size		len;
	text	   *result;

	/* The text is built behind room for the varlena header: no copy. */
	result = (text *) canonical_text(jb, VARHDRSZ, &len);
	SET_VARSIZE(result, len + VARHDRSZ);
	PG_RETURN_TEXT_P(result);
}

/*
 * idem_fingerprint(jsonb) RETURNS bytea: SHA-256 of the canonical text.
 */
Datum
idem_fingerprint(PG_FUNCTION_ARGS)
{
	Jsonb	   *jb = PG_GETARG_JSONB_P(0);
	bytea	   *result = palloc(VARHDRSZ + IDEM_FINGERPRINT_LEN);

	idem_fingerprint_jsonb(jb, (uint8 *) VARDATA(result));
	SET_VARSIZE(result, VARHDRSZ + IDEM_FINGERPRINT_LEN);
	PG_RETURN_BYTEA_P(result);
}

/* ---------------------------------------------------------------------
 * Interface for the rest of the extension (canonical.h)
 * ---------------------------------------------------------------------
 */

/*
 * The canonical text of a jsonb value, NUL-terminated and palloc'd in the
 * current memory context; its length in bytes goes to *len.
 */
char *
idem_canonical_cstring(Jsonb *jb, int *len)
{
	Size		textlen;
	char	   *result = canonical_text(jb, 0, &textlen);

	*len = (int) textlen;
	return result;
}

/*
 * Build the canonical text of a jsonb value in one palloc'd buffer of the
 * current memory context, after start reserved bytes, and NUL-terminate
 * it.  Returns the buffer; the text's length goes to *len.  The walk's own
 * allocations live in a context of their own, deleted before returning.
 */
static char *
canonical_text(Jsonb *jb, Size start, Size *len)
{
	MemoryContext callercxt = CurrentMemoryContext;
	MemoryContext walkcxt;
	CanonSink	sink;

	walkcxt = AllocSetContextCreate(callercxt, "idempotency canonical",
									ALLOCSET_DEFAULT_SIZES);
	sink.start = start;
	/* jsonb's binary form is about as long as the canonical text */
	sink.cap = Max(CANON_TEXT_INITIAL, (Size) VARSIZE(jb) + start + 1);
	sink.buf = palloc(sink.cap);
	sink.len = start;
	sink.hashing = false;
	sink.hash = NULL;

	MemoryContextSwitchTo(walkcxt);
	canonical_write(&jb->root, &sink);
	MemoryContextSwitchTo(callercxt);
	MemoryContextDelete(walkcxt);

	sink_reserve(&sink, 1);
	sink.buf[sink.len] = '\0';
	*len = sink.len - start;
	return sink.buf;
}

/*
 * SHA-256 of the canonical text of a jsonb value, written to digest
 * (IDEM_FINGERPRINT_LEN bytes).  The text is hashed as it is produced,
 * one buffer at a time, and never held whole.
 */
void
idem_fingerprint_jsonb(Jsonb *jb, uint8 *digest)
{
	MemoryContext callercxt = CurrentMemoryContext;
	MemoryContext walkcxt;
	CanonSink	sink;
	char		chunk[CANON_HASH_CHUNK];

	walkcxt = AllocSetContextCreate(callercxt, "idempotency fingerprint",
									ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(walkcxt);

	sink.start = 0;
	sink.cap = CANON_HASH_CHUNK;
	sink.buf = chunk;
	sink.len = 0;
	sink.hashing = true;
	sink.hash = NULL;

	canonical_write(&jb->root, &sink);

	if (sink.hash == NULL)
		idem_sha256((const uint8 *) sink.buf, sink.len, digest);
	else
	{
		sink_flush(&sink);
		if (pg_cryptohash_final(sink.hash, digest, IDEM_FINGERPRINT_LEN) < 0)
			elog(ERROR, "could not finalize SHA-256: %s",
				 pg_cryptohash_error(sink.hash));
		pg_cryptohash_free(sink.hash);
	}

	MemoryContextSwitchTo(callercxt);
	MemoryContextDelete(walkcxt);
}

/* ---------------------------------------------------------------------
 * Output buffer
 * ---------------------------------------------------------------------
 */

/* Hash what the buffer holds and empty it (hash mode only). */
static void
sink_flush(CanonSink *sink)
{
	Assert(sink->hashing);
	if (sink->hash == NULL)
	{
		sink->hash = pg_cryptohash_create(PG_SHA256);
		if (pg_cryptohash_init(sink->hash) < 0)
			elog(ERROR, "could not initialize SHA-256 context: %s",
				 pg_cryptohash_error(sink->hash));
	}
	if (sink->len > 0 &&
		pg_cryptohash_update(sink->hash, (uint8 *) sink->buf, sink->len) < 0)
		elog(ERROR, "could not update SHA-256: %s",
			 pg_cryptohash_error(sink->hash));
	sink->len = 0;
}

/*
 * Make room for need more bytes: flush in hash mode, grow in text mode.
 * In hash mode need must not exceed the buffer's size; longer pieces go
 * through sink_write, which hashes them directly.
 */
static void
sink_reserve(CanonSink *sink, Size need)
{
	Size		newcap;

	if (sink->len + need <= sink->cap)
		return;
	if (sink->hashing)
	{
		Assert(need <= sink->cap);
		sink_flush(sink);
		return;
	}
	/* The text must fit in one text datum. */
	if (sink->len + need > (Size) MaxAllocSize)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("canonical JSON text is too long"),
				 errdetail("A text value holds at most %zu bytes.",
						   (Size) MaxAllocSize - VARHDRSZ - 1)));
	newcap = sink->cap;
	while (newcap < sink->len + need)
		newcap *= 2;
	newcap = Min(newcap, (Size) MaxAllocSize);
	sink->buf = repalloc(sink->buf, newcap);
	sink->cap = newcap;
}

/* Append one byte. */
static inline void
sink_putc(CanonSink *sink, char c)
{
	if (unlikely(sink->len >= sink->cap))
		sink_reserve(sink, 1);
	sink->buf[sink->len++] = c;
}

/* Append len bytes. */
static inline void
sink_write(CanonSink *sink, const char *data, Size len)
{
	if (unlikely(sink->len + len > sink->cap))
	{
		if (sink->hashing && len > sink->cap / 2)
		{
			/* A long piece: hash it where it is rather than copying it. */
			sink_flush(sink);
			if (pg_cryptohash_update(sink->hash, (const uint8 *) data, len) < 0)
				elog(ERROR, "could not update SHA-256: %s",
					 pg_cryptohash_error(sink->hash));
			return;
		}
		sink_reserve(sink, len);
	}
	memcpy(sink->buf + sink->len, data, len);
	sink->len += len;
}

/* ---------------------------------------------------------------------
 * The walk
 * ---------------------------------------------------------------------
 */

/*
 * Write the canonical text of a jsonb root container to sink.
 */
static void
canonical_write(JsonbContainer *root, CanonSink *sink)
{
	CanonWalk	walk;

	/* A scalar root is stored as a one-element array flagged scalar. */
	if (JsonContainerIsScalar(root))
	{
		JEntry		entry = root->children[0];

		write_scalar(sink, entry, (char *) &root->children[1], 0,
					 JBE_OFFLENFLD(entry));
		return;
	}

	walk.maxframes = 16;
	walk.frames = palloc(sizeof(CanonFrame) * walk.maxframes);
	walk.nframes = 0;
	walk.maxmembers = 64;
	walk.members = palloc(sizeof(CanonMember) * walk.maxmembers);
	walk.nmembers = 0;

	push_container(&walk, sink, root);

	while (walk.nframes > 0)
	{
		CanonFrame *frame = &walk.frames[walk.nframes - 1];
		JEntry		entry;
		uint32		offset;
		uint32		length;

		if (frame->next == frame->count)
		{
			/* Close the container and pop its frame. */
			if (frame->is_object)
			{
				sink_putc(sink, '}');
				walk.nmembers = frame->members;
			}
			else
				sink_putc(sink, ']');
			walk.nframes--;
			continue;
		}

		if (frame->next > 0)
			sink_putc(sink, ',');

		if (frame->is_object)
		{
			CanonMember *m = &walk.members[frame->members + frame->next];

			write_string(sink, m->key, m->keylen);
			sink_putc(sink, ':');
			entry = m->valentry;
			offset = m->valoff;
			length = m->vallen;
		}
		else
		{
			entry = frame->jc->children[frame->next];
			offset = frame->offset;
			JBE_ADVANCE_OFFSET(frame->offset, entry);
			length = frame->offset - offset;
		}
		frame->next++;

		if (JBE_ISCONTAINER(entry))
		{
			/* frame may move: push_container can enlarge the stack */
			push_container(&walk, sink,
						   (JsonbContainer *) (frame->base + INTALIGN(offset)));
		}
		else
			write_scalar(sink, entry, frame->base, offset, length);
	}
}

/*
 * Open a container: write its opening bracket and push a frame for it.  For
 * an object, collect its members on the member stack in canonical order.
 */
static void
push_container(CanonWalk *walk, CanonSink *sink, JsonbContainer *jc)
{
	CanonFrame *frame;
	uint32		count = JsonContainerSize(jc);
	bool		is_object = JsonContainerIsObject(jc);
	uint32		nchildren = is_object ? count * 2 : count;

	/* Deep documents cost heap, not C stack; still let the user cancel. */
	CHECK_FOR_INTERRUPTS();

	if (walk->nframes == walk->maxframes)
	{
		walk->maxframes *= 2;
		walk->frames = repalloc(walk->frames,
								sizeof(CanonFrame) * walk->maxframes);
	}
	frame = &walk->frames[walk->nframes++];
	frame->jc = jc;
	frame->base = (char *) &jc->children[nchildren];
	frame->count = count;
	frame->next = 0;
	frame->offset = 0;
	frame->is_object = is_object;
	frame->members = walk->nmembers;

	if (!is_object)
	{
		Assert(JsonContainerIsArray(jc));
		sink_putc(sink, '[');
		return;
	}

	sink_putc(sink, '{');
	if (count == 0)
		return;

	if (walk->nmembers + count > walk->maxmembers)
	{
		while (walk->nmembers + count > walk->maxmembers)
			walk->maxmembers *= 2;
		walk->members = repalloc_huge(walk->members,
									  sizeof(CanonMember) * walk->maxmembers);
	}

	{
		CanonMember *members = &walk->members[walk->nmembers];
		uint32		offset = 0;
		uint32		i;

		/* Keys come first, then the values in the same order. */
		for (i = 0; i < count; i++)
		{
			uint32		start = offset;

			JBE_ADVANCE_OFFSET(offset, jc->children[i]);
			members[i].key = frame->base + start;
			members[i].keylen = offset - start;
			members[i].prefix = member_name_prefix(members[i].key,
												   members[i].keylen);
		}
		for (i = 0; i < count; i++)
		{
			JEntry		entry = jc->children[count + i];
			uint32		start = offset;

			JBE_ADVANCE_OFFSET(offset, entry);
			members[i].valoff = start;
			members[i].vallen = offset - start;
			members[i].valentry = entry;
		}
		if (count > 1)
			sort_members(members, count);
	}
	walk->nmembers += count;
}

/*
 * Write a scalar child stored at base + offset (length bytes).
 */
static void
write_scalar(CanonSink *sink, JEntry entry, char *base, uint32 offset,
			 uint32 length)
{
	switch (entry & JENTRY_TYPEMASK)
	{
		case JENTRY_ISSTRING:
			write_string(sink, base + offset, length);
			break;
		case JENTRY_ISNUMERIC:
			/* numerics are int-aligned inside the container */
			write_number(sink, (Numeric) (base + INTALIGN(offset)));
			break;
		case JENTRY_ISBOOL_TRUE:
			sink_write(sink, "true", 4);
			break;
		case JENTRY_ISBOOL_FALSE:
			sink_write(sink, "false", 5);
			break;
		case JENTRY_ISNULL:
			sink_write(sink, "null", 4);
			break;
		default:
			elog(ERROR, "unexpected jsonb entry type: %u",
				 (unsigned) (entry & JENTRY_TYPEMASK));
	}
}

/*
 * Does any of the 8 bytes of word need an escape: a control character
 * (below 0x20), '"' or '\\'?  The classic bit tricks (Hacker's Delight,
 * "find a byte in a word"): for each byte b, (b - k) & ~b & 0x80 is set for
 * some byte exactly when some b < k; XOR with a repeated byte turns "equal"
 * into "zero", that is "below 1".
 */
static inline bool
word_needs_escape(uint64 word)
{
	const uint64 ones = UINT64CONST(0x0101010101010101);
	const uint64 highs = UINT64CONST(0x8080808080808080);
	uint64		quote = word ^ (ones * '"');
	uint64		backslash = word ^ (ones * '\\');

	return (((word - ones * 0x20) & ~word) |
			((quote - ones) & ~quote) |
			((backslash - ones) & ~backslash)) & highs;
}

/*
 * Write a JSON string (s is UTF-8, unescaped, as jsonb stores it) with
 * RFC 8785 escaping: \b \t \n \f \r \" \\, \u00xx in lower-case hex for the
 * other control characters, everything else as is.  Runs of bytes that need
 * no escape are copied in one go.
 */
static void
write_string(CanonSink *sink, const char *s, uint32 len)
{
	static const char hex[] = "0123456789abcdef";
	uint32		run = 0;
	uint32		i = 0;

	sink_putc(sink, '"');
	while (i < len)
	{
		unsigned char c;
		char		esc;

		/* Skip 8 bytes at a time while none of them needs an escape. */
		if (i + sizeof(uint64) <= len)
		{
			uint64		word;

			memcpy(&word, s + i, sizeof(uint64));
			if (!word_needs_escape(word))
			{
				i += sizeof(uint64);
				continue;
			}
		}

		c = (unsigned char) s[i];
		esc = escape_table[c];
		if (likely(esc == 0))
		{
			i++;
			continue;
		}

		if (i > run)
			sink_write(sink, s + run, i - run);
		run = i + 1;

		sink_reserve(sink, 6);
		sink->buf[sink->len++] = '\\';
		if (esc == 'u')
		{
			sink->buf[sink->len++] = 'u';
			sink->buf[sink->len++] = '0';
			sink->buf[sink->len++] = '0';
			sink->buf[sink->len++] = hex[c >> 4];
			sink->buf[sink->len++] = hex[c & 0xF];
		}
		else
			sink->buf[sink->len++] = esc;
		i++;
	}
	if (len > run)
		sink_write(sink, s + run, len - run);
	sink_putc(sink, '"');
}

/* Append count copies of '0'. */
static void
write_zeros(CanonSink *sink, int count)
{
	static const char zeros[] = "0000000000000000000000000000000000000000";

	while (count > 0)
	{
		int			n = Min(count, (int) sizeof(zeros) - 1);

		sink_write(sink, zeros, n);
		count -= n;
	}
}

/*
 * The decimal digits of a numeric, read from its stored form: writes
 * 4 * (base-10000 digits) characters '0'-'9' to localbuf if they fit, else
 * to a palloc'd buffer, and returns the buffer.  *ndigits gets their count,
 * *point the index of the decimal point among them (it may lie before the
 * first or after the last: the missing digits are zeros), *negative the
 * sign.  NaN and infinities, which JSON cannot express, raise an error.
 */
static char *
numeric_digits(Numeric num, char *localbuf, int localsize,
			   int *ndigits, int *point, bool *negative)
{
	const char *data = VARDATA_ANY(num);
	Size		size = VARSIZE_ANY_EXHDR(num);
	uint16		header;
	int			weight;
	Size		hdrsize;
	int			nbase;
	char	   *buf;
	char	   *out;
	int			i;

	memcpy(&header, data, sizeof(uint16));
	switch (header & CANON_NUMERIC_FORM_MASK)
	{
		case CANON_NUMERIC_SPECIAL:
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("cannot canonicalize a jsonb number that is NaN or infinite"),
					 errdetail("JSON has no NaN or infinite numbers.")));
			break;
		case CANON_NUMERIC_SHORT:
			*negative = (header & CANON_NUMERIC_SHORT_SIGN) != 0;
			weight = (header & CANON_NUMERIC_SHORT_WEIGHT_MASK);
			if (header & CANON_NUMERIC_SHORT_WEIGHT_SIGN)
				weight |= ~CANON_NUMERIC_SHORT_WEIGHT_MASK;
			hdrsize = sizeof(uint16);
			break;
		default:
			{
				int16		w;

				*negative = (header & CANON_NUMERIC_FORM_MASK) == CANON_NUMERIC_NEG;
				memcpy(&w, data + sizeof(uint16), sizeof(int16));
				weight = w;
				hdrsize = sizeof(uint16) + sizeof(int16);
			}
			break;
	}
	if (unlikely(size < hdrsize))
		elog(ERROR, "invalid numeric in jsonb: %zu bytes", size);

	nbase = (size - hdrsize) / sizeof(int16);
	buf = (nbase * CANON_DEC_DIGITS <= localsize) ? localbuf :
		palloc(nbase * CANON_DEC_DIGITS);
	out = buf;
	for (i = 0; i < nbase; i++)
	{
		int16		d;

		memcpy(&d, data + hdrsize + i * sizeof(int16), sizeof(int16));
		if (unlikely(d < 0 || d >= CANON_NBASE))
			elog(ERROR, "invalid numeric digit in jsonb: %d", d);
		out[0] = '0' + d / 1000;
		out[1] = '0' + (d / 100) % 10;
		out[2] = '0' + (d / 10) % 10;
		out[3] = '0' + d % 10;
		out += CANON_DEC_DIGITS;
	}
	*ndigits = nbase * CANON_DEC_DIGITS;
	*point = (weight + 1) * CANON_DEC_DIGITS;
	return buf;
}

/*
 * Write a number: its exact decimal value in ECMAScript Number::toString
 * form (ECMA-262, section 6.1.6.1.20), applied to the decimal itself rather
 * than to the nearest double.
 *
 * With the value written as s * 10^(n-k), s an integer of k digits without
 * trailing zeros:
 *	 k <= n <= 21	the digits of s, then n-k zeros
 *	 0 < n <= 21	the first n digits, '.', the other k-n
 *	 -6 < n <= 0	"0.", -n zeros, the digits
 *	 otherwise		d[.ddd]e+|-(n-1)
 * Zero (and so negative zero, which numeric cannot even hold) is "0".
 *
 * The digits are read from the numeric's stored form (see numeric_digits)
 * rather than through numeric_out, which would build, and make us parse, a
 * plain-notation string of up to 150,000 characters for every number.
 */
static void
write_number(CanonSink *sink, Numeric num)
{
	char		localbuf[64];
	char	   *digits;
	int			ndigits;
	int			point;
	bool		negative;

	digits = numeric_digits(num, localbuf, sizeof(localbuf),
							&ndigits, &point, &negative);
	write_decimal(sink, digits, ndigits, point, negative);
	if (digits != localbuf)
		pfree(digits);
}

/*
 * Write the decimal value of ndigits decimal digits with the decimal point
 * at index point (it may lie before the first or after the last: the
 * missing digits are zeros), in the form write_number describes.
 */
static void
write_decimal(CanonSink *sink, char *digits, int ndigits, int point,
			  bool negative)
{
	int			first;
	int			last;
	int			n;
	int			k;

	/* s is digits[first..last), the decimal point is at index point */
	for (first = 0; first < ndigits && digits[first] == '0'; first++)
		;
	if (first == ndigits)
	{
		/* zero, whatever its scale or sign */
		sink_putc(sink, '0');
		return;
	}
	for (last = ndigits; digits[last - 1] == '0'; last--)
		;
	k = last - first;
	n = point - first;

	if (negative)
		sink_putc(sink, '-');

	if (k <= n && n <= 21)
	{
		sink_write(sink, digits + first, k);
		write_zeros(sink, n - k);
	}
	else if (0 < n && n <= 21)
	{
		sink_write(sink, digits + first, n);
		sink_putc(sink, '.');
		sink_write(sink, digits + first + n, k - n);
	}
	else if (-6 < n && n <= 0)
	{
		sink_write(sink, "0.", 2);
		write_zeros(sink, -n);
		sink_write(sink, digits + first, k);
	}
	else
	{
		char		expbuf[16];
		int			explen;

		sink_putc(sink, digits[first]);
		if (k > 1)
		{
			sink_putc(sink, '.');
			sink_write(sink, digits + first + 1, k - 1);
		}
		explen = snprintf(expbuf, sizeof(expbuf), "e%c%d",
						  n - 1 >= 0 ? '+' : '-', abs(n - 1));
		sink_write(sink, expbuf, explen);
	}
}

/* ---------------------------------------------------------------------
 * The fingerprint of JSON text, without building a jsonb value
 * ---------------------------------------------------------------------
 */

/*
 * Longest JSON text fingerprinted straight from the text, in bytes.  A
 * longer text goes through jsonb_in and the walk above: an object's
 * members are reordered by copying their canonical text once per level of
 * nesting of objects, which a bound on the whole keeps small, and every
 * limit of jsonb (string and container sizes) lies far beyond it.
 */
#define CANON_DIRECT_MAX	16384

/* Numbers of at most this many characters are canonicalized directly. */
#define CANON_DIRECT_NUMBER_MAX	40

/* One open container of JSON text being canonicalized. */
typedef struct TextFrame
{
	Size		start;			/* where its text starts in the sink */
	uint32		members;		/* objects: first member in the member stack */
	uint32		count;			/* elements or members so far */
	bool		is_object;
} TextFrame;

/* The state of the parse: the canonical text so far and open containers. */
typedef struct TextCanon
{
	CanonSink	sink;
	TextFrame  *frames;
	int			nframes;
	int			maxframes;
	CanonMember *members;
	uint32		nmembers;
	uint32		maxmembers;
	char	   *scratch;		/* where an object's values are copied aside */
	Size		scratchcap;
} TextCanon;

/*
 * Containers nested deeper than this are left to PostgreSQL's parser, which
 * checks the stack depth as jsonb_in does.
 */
#define CANON_DIRECT_DEPTH	256

static void text_canon_init(TextCanon *state, int len);
static bool text_canonical_direct(const char *json, int len, TextCanon *state);
static void text_canonical_parser(const char *json, int len, TextCanon *state);
static bool write_number_digits(CanonSink *sink, const char *token, int len);
static void write_number_text(CanonSink *sink, const char *token, int len);

/*
 * SHA-256 of the canonical text of the JSON value that a text holds, the
 * same digest as idem_fingerprint_jsonb gives for that text cast to jsonb,
 * written to digest.  Text that jsonb refuses is refused with the same
 * error, by the same parser.
 *
 * The text is written in canonical form as it is read: scalars as the walk
 * writes them, each object's members sorted once the object ends, a
 * repeated name keeping its last value, as jsonb does.  No jsonb value is
 * built.  A reader of its own takes the common text, without escapes in
 * its strings (text_canonical_direct); anything else, and anything that
 * reader does not accept, is read again by PostgreSQL's JSON parser, the
 * one jsonb_in uses, which raises jsonb_in's errors.
 */
void
idem_fingerprint_json_text(text *json, uint8 *digest)
{
	static MemoryContext parsecxt = NULL;
	MemoryContext callercxt = CurrentMemoryContext;
	TextCanon	state;
	const char *data = VARDATA_ANY(json);
	int			len = VARSIZE_ANY_EXHDR(json);

	if (len > CANON_DIRECT_MAX)
	{
		Datum		jb = DirectFunctionCall1(jsonb_in,
											 CStringGetDatum(text_to_cstring(json)));

		idem_fingerprint_jsonb(DatumGetJsonbP(jb), digest);
		return;
	}

	/*
	 * One context for the whole backend, emptied after each text (and
	 * before, after a text whose parse raised an error): cheaper than a
	 * context made and deleted for each.
	 */
	if (parsecxt == NULL)
		parsecxt = AllocSetContextCreate(TopMemoryContext,
										 "idempotency fingerprint of JSON text",
										 ALLOCSET_DEFAULT_SIZES);
	MemoryContextReset(parsecxt);
	MemoryContextSwitchTo(parsecxt);
	text_canon_init(&state, len);
	if (!text_canonical_direct(data, len, &state))
	{
		text_canon_init(&state, len);
		text_canonical_parser(data, len, &state);
	}
	idem_sha256((const uint8 *) state.sink.buf, state.sink.len, digest);
	MemoryContextSwitchTo(callercxt);
	MemoryContextReset(parsecxt);
}

/* An empty state for a text of len bytes, in the current memory context. */
static void
text_canon_init(TextCanon *state, int len)
{
	state->sink.start = 0;
	state->sink.cap = Max(CANON_TEXT_INITIAL, (Size) len + 1);
	state->sink.buf = palloc(state->sink.cap);
	state->sink.len = 0;
	state->sink.hashing = false;
	state->sink.hash = NULL;
	state->maxframes = 16;
	state->frames = palloc(sizeof(TextFrame) * state->maxframes);
	state->nframes = 0;
	state->maxmembers = 64;
	state->members = palloc(sizeof(CanonMember) * state->maxmembers);
	state->nmembers = 0;
	state->scratch = NULL;
	state->scratchcap = 0;
}

/*
 * Write a string that holds nothing RFC 8785 escapes (no control character,
 * quote or backslash), as write_string would, without looking for one.
 */
static inline void
write_plain_string(CanonSink *sink, const char *s, uint32 len)
{
	sink_reserve(sink, len + 2);
	sink->buf[sink->len++] = '"';
	memcpy(sink->buf + sink->len, s, len);
	sink->len += len;
	sink->buf[sink->len++] = '"';
}

/* Open a container of the text: push its frame. */
static void
text_push(TextCanon *state, bool is_object)
{
	TextFrame  *frame;

	if (state->nframes == state->maxframes)
	{
		state->maxframes *= 2;
		state->frames = repalloc(state->frames,
								 sizeof(TextFrame) * state->maxframes);
	}
	frame = &state->frames[state->nframes++];
	frame->start = state->sink.len;
	frame->members = state->nmembers;
	frame->count = 0;
	frame->is_object = is_object;
}

/*
 * A member of the innermost object begins: its name, unescaped; plain when
 * it holds nothing RFC 8785 escapes.
 */
static void
text_member_start(TextCanon *state, const char *key, uint32 keylen,
				  bool plain)
{
	TextFrame  *frame = &state->frames[state->nframes - 1];
	CanonMember *m;

	if (state->nmembers == state->maxmembers)
	{
		state->maxmembers *= 2;
		state->members = repalloc(state->members,
								  sizeof(CanonMember) * state->maxmembers);
	}
	m = &state->members[state->nmembers++];
	m->key = key;
	m->keylen = keylen;
	m->prefix = member_name_prefix(key, keylen);
	m->order = frame->count++;
	m->valoff = state->sink.len - frame->start;
	m->vallen = 0;
	m->plain = plain;
}

/* The value of the innermost object's last member is written. */
static void
text_member_end(TextCanon *state)
{
	TextFrame  *frame = &state->frames[state->nframes - 1];
	CanonMember *m = &state->members[state->nmembers - 1];

	m->vallen = state->sink.len - frame->start - m->valoff;
}

/*
 * Close an object: its members' values were written one after the other
 * where the object starts; they are copied aside and written back in
 * canonical order with their names, the last of each name only.
 */
static void
text_object_close(TextCanon *state)
{
	TextFrame  *frame = &state->frames[state->nframes - 1];
	CanonMember *members = &state->members[frame->members];
	uint32		count = state->nmembers - frame->members;
	Size		valueslen = state->sink.len - frame->start;
	char	   *values = state->scratch;
	uint32		i;

	if (valueslen > state->scratchcap)
	{
		state->scratchcap = Max(valueslen, (Size) 256);
		state->scratch = values = state->scratch ?
			repalloc(state->scratch, state->scratchcap) :
			palloc(state->scratchcap);
	}
	if (valueslen > 0)
		memcpy(values, state->sink.buf + frame->start, valueslen);
	if (count > 1)
		sort_text_members(members, count);

	state->sink.len = frame->start;
	sink_putc(&state->sink, '{');
	for (i = 0; i < count; i++)
	{
		CanonMember *m = &members[i];

		/* after the last member of a name, its earlier ones */
		if (i > 0 && m->keylen == members[i - 1].keylen &&
			memcmp(m->key, members[i - 1].key, m->keylen) == 0)
			continue;
		if (i > 0)
			sink_putc(&state->sink, ',');
		if (m->plain)
			write_plain_string(&state->sink, m->key, m->keylen);
		else
			write_string(&state->sink, m->key, m->keylen);
		sink_putc(&state->sink, ':');
		sink_write(&state->sink, values + m->valoff, m->vallen);
	}
	sink_putc(&state->sink, '}');

	state->nmembers = frame->members;
	state->nframes--;
}

/* Open an array. */
static void
text_array_open(TextCanon *state)
{
	text_push(state, false);
	sink_putc(&state->sink, '[');
}

/* An element of the innermost array begins. */
static void
text_element_start(TextCanon *state)
{
	TextFrame  *frame = &state->frames[state->nframes - 1];

	if (frame->count++ > 0)
		sink_putc(&state->sink, ',');
}

/* Close an array. */
static void
text_array_close(TextCanon *state)
{
	sink_putc(&state->sink, ']');
	state->nframes--;
}

/*
 * Whether a byte may continue a token of PostgreSQL's JSON lexer (its
 * JSON_ALPHANUMERIC_CHAR): a number or keyword followed by one is not a
 * token the direct reader takes.
 */
static inline bool
text_token_char(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		(c >= '0' && c <= '9') || c == '_' || c >= 0x80;
}

/*
 * The literal word (true, false or null) at p, written to the sink: the
 * position after it, or NULL when the text there is not exactly the word
 * (a longer token, as "trueish", is not).
 */
static const char *
take_word(const char *p, const char *end, const char *word, size_t len,
		  TextCanon *state)
{
	if ((size_t) (end - p) < len || memcmp(p, word, len) != 0)
		return NULL;
	p += len;
	if (p < end && text_token_char(*p))
		return NULL;
	sink_write(&state->sink, word, len);
	return p;
}

/*
 * The end of a string's text that starts at p: the closing quote, or NULL
 * when a backslash, a control character or the end of the text comes
 * first (a string to leave to PostgreSQL's parser).
 */
static pg_attribute_always_inline const char *
plain_string_end(const char *p, const char *end)
{
	for (;;)
	{
		uint64		word;

		if (end - p >= (ptrdiff_t) sizeof(uint64))
		{
			memcpy(&word, p, sizeof(uint64));
			if (!word_needs_escape(word))
			{
				p += sizeof(uint64);
				continue;
			}
		}
		if (p == end || *p == '\\' || (unsigned char) *p < 0x20)
			return NULL;
		if (*p == '"')
			return p;
		p++;
	}
}

/*
 * Read the common JSON text straight into state: whitespace, the six
 * structural characters, strings without a backslash, numbers and the
 * three keywords, at most CANON_DIRECT_DEPTH containers deep.  Returns
 * false at anything else, valid or not, with state left half-written: the
 * caller reads the text again with PostgreSQL's parser, which decides.
 * What it accepts is a subset of what that parser accepts, and it writes
 * the same canonical text for it.
 */
static bool
text_canonical_direct(const char *json, int len, TextCanon *state)
{
	const char *p = json;
	const char *end = json + len;

#define SKIP_WHITESPACE() \
	while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) \
		p++

value:
	SKIP_WHITESPACE();
	if (p == end)
		return false;
	switch (*p)
	{
		case '{':
			if (state->nframes >= CANON_DIRECT_DEPTH)
				return false;
			p++;
			text_push(state, true);
			SKIP_WHITESPACE();
			if (p < end && *p == '}')
			{
				p++;
				text_object_close(state);
				goto after_value;
			}
			goto member;
		case '[':
			if (state->nframes >= CANON_DIRECT_DEPTH)
				return false;
			p++;
			text_array_open(state);
			SKIP_WHITESPACE();
			if (p < end && *p == ']')
			{
				p++;
				text_array_close(state);
				goto after_value;
			}
			text_element_start(state);
			goto value;
		case '"':
			{
				const char *s = ++p;

				if ((p = plain_string_end(p, end)) == NULL)
					return false;
				write_plain_string(&state->sink, s, p - s);
				p++;
			}
			goto after_value;
		case 't':
			if ((p = take_word(p, end, "true", 4, state)) == NULL)
				return false;
			goto after_value;
		case 'f':
			if ((p = take_word(p, end, "false", 5, state)) == NULL)
				return false;
			goto after_value;
		case 'n':
			if ((p = take_word(p, end, "null", 4, state)) == NULL)
				return false;
			goto after_value;
		default:
			{
				/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
				const char *s = p;

				if (p < end && *p == '-')
					p++;
				if (p == end || *p < '0' || *p > '9')
					return false;
				if (*p == '0')
					p++;
				else
					while (p < end && *p >= '0' && *p <= '9')
						p++;
				if (p < end && *p == '.')
				{
					p++;
					if (p == end || *p < '0' || *p > '9')
						return false;
					while (p < end && *p >= '0' && *p <= '9')
						p++;
				}
				if (p < end && (*p == 'e' || *p == 'E'))
				{
					p++;
					if (p < end && (*p == '+' || *p == '-'))
						p++;
					if (p == end || *p < '0' || *p > '9')
						return false;
					while (p < end && *p >= '0' && *p <= '9')
						p++;
				}
				if (p < end && text_token_char(*p))
					return false;

				/*
				 * A number numeric_in must read is left to the parser: jsonb_in
				 * reads it only once the next token is lexed, so an invalid
				 * token there is the error, not the number's.
				 */
				if (!write_number_digits(&state->sink, s, p - s))
					return false;
			}
			goto after_value;
	}

member:
	/* a member's name, then its value; at most one object's members sorted */
	SKIP_WHITESPACE();
	if (p == end || *p != '"')
		return false;
	{
		const char *s = ++p;

		/* names are short: byte by byte */
		while (p < end && *p != '"' && *p != '\\' && (unsigned char) *p >= 0x20)
			p++;
		if (p == end || *p != '"')
			return false;
		text_member_start(state, s, p - s, true);
		p++;
	}
	SKIP_WHITESPACE();
	if (p == end || *p != ':')
		return false;
	p++;
	goto value;

after_value:
	if (state->nframes > 0 && state->frames[state->nframes - 1].is_object)
		text_member_end(state);
	SKIP_WHITESPACE();
	if (state->nframes == 0)
		return p == end;
	if (p == end)
		return false;
	if (*p == ',')
	{
		p++;
		if (state->frames[state->nframes - 1].is_object)
			goto member;
		text_element_start(state);
		goto value;
	}
	if (*p == '}' && state->frames[state->nframes - 1].is_object)
	{
		p++;
		text_object_close(state);
		goto after_value;
	}
	if (*p == ']' && !state->frames[state->nframes - 1].is_object)
	{
		p++;
		text_array_close(state);
		goto after_value;
	}
	return false;

#undef SKIP_WHITESPACE
}

/* The callbacks of PostgreSQL's JSON parser, on the functions above. */
static json_action_result_compat
text_object_start(void *arg)
{
	text_push((TextCanon *) arg, true);
	json_action_done_compat;
}

static json_action_result_compat
text_object_field_start(void *arg, char *fname, bool isnull)
{
	(void) isnull;
	text_member_start((TextCanon *) arg, fname, strlen(fname), false);
	json_action_done_compat;
}

static json_action_result_compat
text_object_field_end(void *arg, char *fname, bool isnull)
{
	(void) fname;
	(void) isnull;
	text_member_end((TextCanon *) arg);
	json_action_done_compat;
}

static json_action_result_compat
text_object_end(void *arg)
{
	text_object_close((TextCanon *) arg);
	json_action_done_compat;
}

static json_action_result_compat
text_array_start(void *arg)
{
	text_array_open((TextCanon *) arg);
	json_action_done_compat;
}

static json_action_result_compat
text_array_element_start(void *arg, bool isnull)
{
	(void) isnull;
	text_element_start((TextCanon *) arg);
	json_action_done_compat;
}

static json_action_result_compat
text_array_end(void *arg)
{
	text_array_close((TextCanon *) arg);
	json_action_done_compat;
}

static json_action_result_compat
text_scalar(void *arg, char *token, JsonTokenType tokentype)
{
	TextCanon  *state = (TextCanon *) arg;

	switch (tokentype)
	{
		case JSON_TOKEN_STRING:
			write_string(&state->sink, token, strlen(token));
			break;
		case JSON_TOKEN_NUMBER:
			write_number_text(&state->sink, token, strlen(token));
			break;
		case JSON_TOKEN_TRUE:
			sink_write(&state->sink, "true", 4);
			break;
		case JSON_TOKEN_FALSE:
			sink_write(&state->sink, "false", 5);
			break;
		case JSON_TOKEN_NULL:
			sink_write(&state->sink, "null", 4);
			break;
		default:
			elog(ERROR, "unexpected JSON token type: %d", (int) tokentype);
	}
	json_action_done_compat;
}

/*
 * Parse len bytes of JSON text with PostgreSQL's JSON parser, as jsonb_in
 * does, and leave its canonical text in state->sink.  Errors are
 * jsonb_in's: the same parser raises them.
 */
static void
text_canonical_parser(const char *json, int len, TextCanon *state)
{
	JsonLexContext *lex;
	JsonSemAction sem;

	memset(&sem, 0, sizeof(sem));
	sem.semstate = state;
	sem.object_start = text_object_start;
	sem.object_end = text_object_end;
	sem.object_field_start = text_object_field_start;
	sem.object_field_end = text_object_field_end;
	sem.array_start = text_array_start;
	sem.array_end = text_array_end;
	sem.array_element_start = text_array_element_start;
	sem.scalar = text_scalar;

	lex = makeJsonLexContextCstringLen_compat(json, len, GetDatabaseEncoding(), true);
	pg_parse_json_or_ereport(lex, &sem);
}

/*
 * Write a number token of JSON text (len bytes) as write_number writes the
 * jsonb numeric it stands for.  A short token with an exponent of at most
 * three digits is read directly (write_number_digits); any other goes
 * through numeric_in, so that a number numeric cannot hold raises
 * numeric_in's error, as it does in jsonb_in.
 */
static void
write_number_text(CanonSink *sink, const char *token, int len)
{
	if (write_number_digits(sink, token, len))
		return;
	write_number(sink,
				 DatumGetNumeric(DirectFunctionCall3(numeric_in,
													 CStringGetDatum(pnstrdup(token, len)),
													 ObjectIdGetDatum(InvalidOid),
													 Int32GetDatum(-1))));
}

/*
 * Write a number token of JSON text (len bytes) read digit by digit, when
 * it is short and its exponent has at most three digits: its value fits
 * numeric (numeric_in would accept it) and is exact in both.  Returns false,
 * having written nothing, for any other token.
 */
static bool
write_number_digits(CanonSink *sink, const char *token, int len)
{
	char		digits[CANON_DIRECT_NUMBER_MAX];
	int			ndigits = 0;
	int			point;
	int			exponent = 0;
	bool		negative = false;
	const char *p = token;
	const char *end = token + len;

	if (len > CANON_DIRECT_NUMBER_MAX)
		return false;

	/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, checked by the reader */
	if (p < end && *p == '-')
	{
		negative = true;
		p++;
	}
	while (p < end && *p >= '0' && *p <= '9')
		digits[ndigits++] = *p++;
	point = ndigits;
	if (p < end && *p == '.')
	{
		p++;
		while (p < end && *p >= '0' && *p <= '9')
			digits[ndigits++] = *p++;
	}
	if (p < end && (*p == 'e' || *p == 'E'))
	{
		bool		negative_exponent = false;
		int			expdigits = 0;

		p++;
		if (p < end && (*p == '+' || *p == '-'))
			negative_exponent = *p++ == '-';
		while (p < end && *p >= '0' && *p <= '9')
		{
			if (++expdigits > 3)
				return false;
			exponent = exponent * 10 + (*p++ - '0');
		}
		if (negative_exponent)
			exponent = -exponent;
	}
	if (p != end || ndigits == 0)
		elog(ERROR, "unexpected JSON number: \"%.*s\"", len, token);

	write_decimal(sink, digits, ndigits, point + exponent, negative);
	return true;
}
