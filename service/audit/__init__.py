"""The audit trail: one event per change (in the change's own transaction) and per refused
request of a known caller (in a transaction of its own), read back by admins only."""
