# Makefile for the idempotency extension (PGXS)

MODULE_big = idempotency
OBJS = \
	idempotency.o \
	src/canonical.o \
	src/worker.o

EXTENSION = idempotency
DATA = idempotency--1.0.sql

PG_CPPFLAGS = -I$(srcdir)/src

REGRESS = setup
REGRESS_OPTS = --inputdir=$(srcdir)

ISOLATION = plain_insert_blocks
ISOLATION_OPTS = --inputdir=$(srcdir) --load-extension=idempotency

TAP_TESTS = 1

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
