"""Many models behind one front (SPEC §9): the configured models, the names requests use,
the memory budget they load under, and the pool that routes each request to its model's
own supervisor."""
