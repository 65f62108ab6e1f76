# Makefile for the idempotency extension (PGXS)

MODULE_big = idempotency
EXTENSION = idempotency
DATA = idempotency--1.0.sql idempotency--1.0--1.1.sql
PG_CPPFLAGS = -I$(srcdir)/src

OBJS = idempotency.o
REGRESS = setup claim pending_claim pending_partition state_machine bad_input \
	table_changes
REGRESS_OPTS = --inputdir=$(srcdir) --encoding=UTF8
ISOLATION = plain_insert_blocks claim_concurrent claim_external isolation_levels
ISOLATION_OPTS = --inputdir=$(srcdir) --load-extension=idempotency
# The suites expect the per-call defaults, whatever the server's
# postgresql.conf says (make installcheck runs against any server).
installcheck: export PGOPTIONS += -c idempotency.default_ttl=1d \
	-c idempotency.default_lease=30s -c idempotency.claim_wait=0
TAP_TESTS = 1

# Canonical JSON and fingerprint
OBJS += src/canonical.o src/sha256.o
REGRESS += canonical canonical_numbers

# Claims, records and the state machine
OBJS += src/state_machine.o src/catalog.o src/decision.o src/records.o \
	src/record_writer.o src/pending_claim.o \
	src/key_lock.o src/token.o src/validate.o src/claim.o src/attempt.o \
	src/derive.o

# Exact responses: encryption at rest through OpenSSL, which PostgreSQL
# itself links
OBJS += src/response_seal.o
SHLIB_LINK += -lcrypto

# Security: role isolation, least privilege, hostile input
OBJS += src/security.o
REGRESS += security
ISOLATION += claim_roles token_probe wait_takeover

# Background worker and maintenance passes
OBJS += src/worker.o src/worker_status.o src/maintenance.o
REGRESS += maintenance

# Operations: counters in shared memory, self-service listing
OBJS += src/stat_operations.o src/list.o
REGRESS += stat_operations list

# Expiry: tombstones and the expired answer
REGRESS += expiry archive_faults archive_reuse

# The per-role rate of new keys
OBJS += src/rate_limit.o
REGRESS += rate_limit rate_limit_attack

# Versions: 1.0 updated to the default version keeps every record
REGRESS += upgrade exact_replay

# Batches and consumers: idem_inbox, idem_claim_many, no lock per key
# (claim_prepared needs max_prepared_transactions > 0)
REGRESS += inbox claim_many
ISOLATION += claim_many_keys claim_prepared
ISOLATION += maintenance_skip_locked maintenance_late_commit expiry_races expiry_races_archive takeover_wait inbox_races isolation_claim_pending claim_many_cancel


PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# PGXS does not track header dependencies: rebuild every object when one of
# the project's headers changes.
$(OBJS): $(wildcard $(srcdir)/src/*.h)

# The three suites against an installed server, each run even when another
# fails: make installcheck-all (README, "Running the tests against your own
# server").  PGXS's installcheck stops at the first failing suite.
.PHONY: installcheck-all
installcheck-all:
	@status=0; \
	$(MAKE) installcheck ISOLATION= TAP_TESTS= || status=1; \
	$(MAKE) installcheck REGRESS= TAP_TESTS= || status=1; \
	$(MAKE) installcheck REGRESS= ISOLATION= || status=1; \
	exit $$status
