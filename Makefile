# Makefile for the idempotency extension (PGXS)

MODULE_big = idempotency
EXTENSION = idempotency
DATA = idempotency--1.0.sql
PG_CPPFLAGS = -I$(srcdir)/src

OBJS = idempotency.o
REGRESS = setup
REGRESS_OPTS = --inputdir=$(srcdir)
ISOLATION = plain_insert_blocks
ISOLATION_OPTS = --inputdir=$(srcdir) --load-extension=idempotency
TAP_TESTS = 1

# Canonical JSON and fingerprint
OBJS += src/canonical.o
REGRESS += canonical canonical_numbers

# Claims, records and the state machine
OBJS += src/state_machine.o

# Background worker and maintenance passes
OBJS += src/worker.o

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
