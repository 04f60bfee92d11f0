"""The verification ledger: typed, content-addressed, append-only records, the publish gate and recording."""
