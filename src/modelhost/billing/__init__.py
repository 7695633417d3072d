"""Billing in credits: meters (replica memory × loaded time, artifact size × stored time), an
append-only ledger in integer micro-credits, balances, usage reports and enforcement."""
