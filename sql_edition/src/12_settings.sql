--
-- The idempotency.* settings, read where the SQL edition needs them.
--
-- Without the C library nobody defines them: they are placeholders, which
-- any role may SET to any text, and which current_setting(name, true)
-- reads as NULL (never set) or '' (reset).  Both mean the C extension's
-- default.  A value that does not parse is refused where it is read, with
-- the message and SQLSTATE (22023) that the C extension gives at SET.
--

-- Each reader is an inlinable SQL function that answers the default when
-- the setting was never set (the common case: no function call, no
-- parsing), and calls the parser otherwise.

-- An integer setting, in its base unit (unit: NULL, 's', 'ms', 'B' or
-- 'kB'), parsed as PostgreSQL parses an integer setting: a number (a
-- fraction is rounded), optionally followed by a unit of the same kind.
CREATE OR REPLACE FUNCTION idem__setting_integer_parse(
    name      text,
    boot      integer,
    min_value integer,
    max_value integer,
    unit      text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    raw text := nullif(current_setting(name, true), '');
    parts text[];
    number numeric;
    factor numeric;
    result numeric;
    time_units constant text[] := ARRAY['us', 'ms', 's', 'min', 'h', 'd'];
    time_ms constant numeric[] := ARRAY[0.001, 1, 1000, 60000, 3600000, 86400000];
    memory_units constant text[] := ARRAY['B', 'kB', 'MB', 'GB', 'TB'];
    memory_b constant numeric[] := ARRAY[1, 1024, 1048576, 1073741824, 1099511627776];
    hint text;
BEGIN
    IF raw IS NULL THEN
        RETURN boot;
    END IF;
    parts := regexp_match(raw, E'^\\s*([-+]?(?:[0-9]+\\.?[0-9]*|\\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\\s*([A-Za-z]*)\\s*$');
    IF unit IN ('us', 'ms', 's', 'min', 'h', 'd') THEN
        hint := 'Valid units for this parameter are "us", "ms", "s", "min", "h", and "d".';
    ELSIF unit IS NOT NULL THEN
        hint := 'Valid units for this parameter are "B", "kB", "MB", "GB", and "TB".';
    END IF;
    IF parts IS NULL OR (parts[2] <> '' AND unit IS NULL) THEN
        IF hint IS NULL THEN
            RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, raw
                USING ERRCODE = '22023';
        END IF;
        RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, raw
            USING ERRCODE = '22023', HINT = hint;
    END IF;
    -- beyond what a double holds (or too long to read as one): what
    -- PostgreSQL's strtod() refuses, without a hint
    IF pg_catalog.length(parts[1]) > 400
       OR pg_catalog.length(pg_catalog.ltrim(coalesce((regexp_match(parts[1], '[eE][-+]?([0-9]+)$'))[1], ''), '0')) > 4 THEN
        RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, raw
            USING ERRCODE = '22023';
    END IF;
    number := parts[1]::numeric;
    IF number <> 0 AND (abs(number) > 1.7976931348623157e308 OR abs(number) < 2.2250738585072014e-308) THEN
        RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, raw
            USING ERRCODE = '22023';
    END IF;
    IF parts[2] = '' THEN
        factor := 1;
    ELSIF unit = ANY (time_units) AND parts[2] = ANY (time_units) THEN
        factor := time_ms[array_position(time_units, parts[2])]
                  / time_ms[array_position(time_units, unit)];
    ELSIF unit = ANY (memory_units) AND parts[2] = ANY (memory_units) THEN
        factor := memory_b[array_position(memory_units, parts[2])]
                  / memory_b[array_position(memory_units, unit)];
    ELSE
        RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, raw
            USING ERRCODE = '22023', HINT = hint;
    END IF;
    -- rounded half to even, in double precision, as PostgreSQL rounds a
    -- setting's value
    result := round(number::double precision * factor::double precision)::numeric;
    IF result < -2147483648 OR result > 2147483647 THEN
        RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, raw
            USING ERRCODE = '22023', HINT = 'Value exceeds integer range.';
    END IF;
    IF result < min_value OR result > max_value THEN
        RAISE EXCEPTION '% is outside the valid range for parameter "%" (% .. %)',
                        result || coalesce(' ' || unit, ''), name, min_value, max_value
            USING ERRCODE = '22023';
    END IF;
    RETURN result::integer;
END
$$;

-- An enum setting: one of allowed, compared without regard to case as
-- PostgreSQL does; returns the allowed spelling.
CREATE OR REPLACE FUNCTION idem__setting_enum_parse(name text, boot text, allowed text[])
RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    raw text := nullif(current_setting(name, true), '');
    value text;
BEGIN
    IF raw IS NULL THEN
        RETURN boot;
    END IF;
    SELECT a INTO value FROM unnest(allowed) AS a WHERE lower(a) = lower(raw);
    IF value IS NULL THEN
        RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, raw
            USING ERRCODE = '22023',
                  HINT = 'Available values: ' || array_to_string(allowed, ', ') || '.';
    END IF;
    RETURN value;
END
$$;

-- A Boolean setting: what boolean input accepts, as PostgreSQL's setting.
CREATE OR REPLACE FUNCTION idem__setting_boolean_parse(name text, boot boolean)
RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    raw text := nullif(current_setting(name, true), '');
BEGIN
    IF raw IS NULL THEN
        RETURN boot;
    END IF;
    RETURN raw::boolean;
EXCEPTION WHEN invalid_text_representation THEN
    RAISE EXCEPTION 'parameter "%" requires a Boolean value', name
        USING ERRCODE = '22023';
END
$$;

CREATE OR REPLACE FUNCTION idem__setting_integer(
    name      text,
    boot      integer,
    min_value integer,
    max_value integer,
    unit      text DEFAULT NULL)
RETURNS integer
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE WHEN NULLIF(pg_catalog.current_setting(name, true), '') IS NULL THEN boot
            ELSE idem__setting_integer_parse(name, boot, min_value, max_value, unit) END;

CREATE OR REPLACE FUNCTION idem__setting_enum(name text, boot text, allowed text[])
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE WHEN NULLIF(pg_catalog.current_setting(name, true), '') IS NULL THEN boot
            ELSE idem__setting_enum_parse(name, boot, allowed) END;

-- The spellings PostgreSQL itself shows (on, off) and the usual others
-- are read here; the parser, whose exception handler is a subtransaction,
-- is called only for the rest.
CREATE OR REPLACE FUNCTION idem__setting_boolean(name text, boot boolean)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE WHEN NULLIF(pg_catalog.current_setting(name, true), '') IS NULL THEN boot
            WHEN pg_catalog.lower(pg_catalog.current_setting(name, true)) IN ('on', 'true', 'yes', '1') THEN true
            WHEN pg_catalog.lower(pg_catalog.current_setting(name, true)) IN ('off', 'false', 'no', '0') THEN false
            ELSE idem__setting_boolean_parse(name, boot) END;
