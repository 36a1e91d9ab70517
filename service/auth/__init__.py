"""API tokens: stored as hashes, each with a set of scopes."""
