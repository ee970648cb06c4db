-- The fleet's seal key fingerprint: the id of the key that seals (a truncated hash, never the
-- key). A replica whose key ring cannot open values sealed under it refuses to start instead
-- of claiming runs it cannot open.
CREATE TABLE IF NOT EXISTS {schema}.seal_check (
    id         integer PRIMARY KEY CHECK (id = 1),
    key_id     text NOT NULL,
    updated_at double precision NOT NULL
);
