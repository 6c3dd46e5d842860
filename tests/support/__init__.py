"""Helpers of the tests: factories, the ledger, invariants, the reference model, processes."""
